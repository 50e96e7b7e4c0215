#!/usr/bin/env python3
"""Reproduce the original zmqpush README's Stats table the way it was taken:
the shipper running under rsyslog's omprog, measured by pidstat.

    python bench/pidstat.py [SECONDS]    (default 60, as the original)

For each shipper (zmqpush, the naive loop bench/naive.py, C bench/cship.c, and
bench/skeleton.py, the design's shape with none of zmqpush's work) and each
load, a private rsyslogd (its own config and work directory, -n, no /dev/log:
imuxsock's system socket off) takes messages on an imuxsock input at a
private socket path and hands them to an omprog action whose program is the
shipper (template RSYSLOG_SyslogProtocol23Format, as in the original's config),
which sends to bench/ccount.c on 127.0.0.1.  Loads as in the original:
`seq 1 100 | logger -t test -u SOCKET` every 1 s ("slight", 100 lines/s) and
every 0.2 s ("high", 500 lines/s), on an absolute clock, and none.  One warm-up
message first starts the program (omprog starts it lazily), then after its
start-up `pidstat -u -w -p PID 1 SECONDS` measures it while the load runs.
pidstat's %CPU counts all threads; its cswch/s and nvcswch/s are the main
thread's only (as pidstat -w reports them).  Every message must reach ccount.
Prints one markdown table and the command line.
"""
import argparse
import os
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from cref import Counter, build  # noqa: E402

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"
LOADS = {"no load": None, "slight (100 lines/s)": 1.0, "high (500 lines/s)": 0.2}
# The original's 50 ms rows (single-core VM, pidstat -C zmqpush.py 1 60 -u -w).
ORIGINAL = {"no load": (0.52, 19.90, 0.20), "slight (100 lines/s)": (2.78, 25.28, 97.36),
            "high (500 lines/s)": (13.53, 44.29, 456.13)}
CONFIG = """\
global(workDirectory="{work}" processInternalMessages="on")
module(load="imuxsock" SysSock.Use="off")
module(load="omprog")
ruleset(name="ship") {{
  action(type="omprog" binary="{program}" template="RSYSLOG_SyslogProtocol23Format")
}}
input(type="imuxsock" Socket="{socket}" RateLimit.Interval="0" Ruleset="ship")
"""


def children(pid: int) -> list:
    pids = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return pids


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def logger(socket: str, lines: int = 100, text: str = ""):
    """`seq 1 lines | logger -t test -u socket` (or one message, text)."""
    cmd = ["logger", "-t", "test", "-u", socket]
    if text:
        subprocess.run([*cmd, text], check=True)
        return
    seq = subprocess.Popen(["seq", "1", str(lines)], stdout=subprocess.PIPE)
    subprocess.run(cmd, stdin=seq.stdout, check=True)
    seq.stdout.close()
    seq.wait()


def load(socket: str, interval: float, bursts: int):
    """bursts of 100 lines, one every interval seconds from now (absolute clock)."""
    due = time.monotonic()
    for _ in range(bursts):
        time.sleep(max(0.0, due - time.monotonic()))
        logger(socket)
        due += interval


def pidstat(pid: int, seconds: int) -> dict:
    """%CPU, cswch/s and nvcswch/s from pidstat's Average lines."""
    out = subprocess.run(["pidstat", "-u", "-w", "-p", str(pid), "1", str(seconds)],
                         capture_output=True, text=True, env={**os.environ, "LC_ALL": "C"},
                         timeout=seconds + 30).stdout
    values, header = {}, []
    for row in out.splitlines():
        fields = row.split()
        if not fields or fields[0] != "Average:":
            continue
        if "PID" in fields:
            header = fields
        elif header and str(pid) in fields:
            values.update(zip(header[1:], fields[1:]))
    return {key: float(values.get(key, "nan")) for key in ("%CPU", "cswch/s", "nvcswch/s")}


def measure(argv: list, interval, seconds: int) -> dict:
    """One private rsyslogd whose omprog program is argv (ENDPOINT replaced)."""
    bursts = round(seconds / interval) if interval else 0
    expected = 1 + 100 * bursts
    counter = Counter(expected, idle=0)
    argv = [counter.endpoint if a == "ENDPOINT" else a for a in argv]
    work = Path(tempfile.mkdtemp(prefix="zmqpush-pidstat-"))
    socket = str(work / "log.sock")
    program = work / "ship.sh"
    program.write_text(f"#!/bin/sh\nexec {shlex.join(argv)}\n")  # omprog splits on spaces
    program.chmod(0o755)
    (work / "rsyslog.conf").write_text(CONFIG.format(work=work, program=program,
                                                     socket=socket))
    rsyslogd = subprocess.Popen([RSYSLOGD, "-n", "-f", str(work / "rsyslog.conf"),
                                 "-i", str(work / "rsyslogd.pid")],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    shipper = None
    try:
        deadline = time.monotonic() + 10
        while not os.path.exists(socket) and time.monotonic() < deadline:
            time.sleep(0.05)
        logger(socket, text="warm-up")  # omprog starts its program at the first message
        while not (kids := children(rsyslogd.pid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not kids:
            raise RuntimeError("rsyslogd started no omprog program")
        shipper = kids[0]
        time.sleep(1.5)  # the program's start-up is not measured
        loader = threading.Thread(target=load, args=(socket, interval, bursts))
        if bursts:
            loader.start()
        stats = pidstat(shipper, seconds)
        if bursts:
            loader.join()
        stats["received"] = counter.finish(timeout=10)["received"]
        stats["expected"] = expected
    finally:
        if rsyslogd.poll() is None:
            rsyslogd.send_signal(signal.SIGTERM)  # closes the program's stdin
        try:
            rsyslogd.wait(30)
        except subprocess.TimeoutExpired:
            rsyslogd.kill()
            rsyslogd.wait()
        deadline = time.monotonic() + 10
        while shipper and alive(shipper) and time.monotonic() < deadline:
            time.sleep(0.1)
        if shipper and alive(shipper):
            os.kill(shipper, signal.SIGKILL)
        if counter.proc.poll() is None:
            counter.finish(timeout=0)
        shutil.rmtree(work, ignore_errors=True)
    return stats


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("seconds", nargs="?", type=int, default=60,
                   help="pidstat samples (1 s each) per measurement (default 60)")
    p.add_argument("--runs", type=int, default=1, help="alternating runs; medians")
    p.add_argument("--zmqpush", default=str(HERE.parent / "zmqpush.py"),
                   help="the zmqpush.py to measure (default: the one beside bench/)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for zmqpush and naive.py (default: this one)")
    args = p.parse_args()
    if not shutil.which("pidstat"):
        print("pidstat is missing: apt-get install sysstat", file=sys.stderr)
        return 2
    shippers = {
        "zmqpush": [args.python, args.zmqpush, "-c", "ENDPOINT"],
        "naive": [args.python, str(HERE / "naive.py"), "ENDPOINT"],
        "C": [build("cship"), "ENDPOINT"],
        "skeleton": [args.python, str(HERE / "skeleton.py"), "ENDPOINT"],
    }
    results = {(name, ship): [] for name in LOADS for ship in shippers}
    for _ in range(args.runs):
        for name, interval in LOADS.items():
            for ship, argv in shippers.items():
                results[name, ship].append(measure(argv, interval, args.seconds))

    def med(name, ship, key):
        return statistics.median(r[key] for r in results[name, ship])

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "-"

    print(f"pidstat -u -w -p PID 1 {args.seconds} on the omprog program of a private "
          f"rsyslogd, median of {args.runs} alternating runs, receiver bench/ccount.c, "
          f"{os.cpu_count()} CPUs, zmqpush {args.zmqpush}\n")
    print("| load | shipper | %CPU | cswch/s | nvcswch/s | zmqpush/naive %CPU "
          "| zmqpush/C %CPU | received |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for name in LOADS:
        cpu = {ship: med(name, ship, "%CPU") for ship in shippers}
        for ship in shippers:
            runs = results[name, ship]
            got = min(r["received"] for r in runs)
            ratios = (f"{ratio(cpu['zmqpush'], cpu['naive'])} | "
                      f"{ratio(cpu['zmqpush'], cpu['C'])}") if ship == "zmqpush" else " | "
            print(f"| {name} | {ship} | {cpu[ship]:.2f} | {med(name, ship, 'cswch/s'):.2f} "
                  f"| {med(name, ship, 'nvcswch/s'):.2f} | {ratios} "
                  f"| {got:,} of {runs[0]['expected']:,} |")
    print("\nThe original zmqpush (its README, 50 ms poll, single-core VM, 60 s): "
          + "; ".join(f"{name} {cpu:.2f} %CPU, {cs:.2f} cswch/s, {nv:.2f} nvcswch/s"
                      for name, (cpu, cs, nv) in ORIGINAL.items()) + ".")
    script = os.path.relpath(__file__)
    print(f"Command: `{shlex.join(['python', script, *sys.argv[1:]])}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
