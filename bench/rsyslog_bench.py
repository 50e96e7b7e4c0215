#!/usr/bin/env python3
"""rsyslog -> omprog -> zmqpush -> receiver against rsyslog -> omczmq -> receiver.

Same load for each, in one run: N messages of S bytes over one TCP connection into
a private rsyslogd (tests/rsyslog.py), as fast as it takes them; the receiver is
bench/sink.py (strict JSON validation).  omczmq (Debian's rsyslog-czmq) uses a
template that produces zmqpush's JSON.  omprog runs one zmqpush for all workers
(forceSingleInstance, as the README recommends), except in the last mode, which
shows what omprog's default (one zmqpush per queue worker) costs.  Prints
messages/s, the ratio to omczmq, and the CPU-seconds of rsyslogd and of zmqpush.
Median of RUNS alternating runs.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from ports import free_port  # noqa: E402
from rsyslog import PrivateRsyslog  # noqa: E402

ZMQPUSH = HERE.parent / "zmqpush.py"
TICK = os.sysconf("SC_CLK_TCK")
# As the README recommends: one zmqpush for all of rsyslog's queue workers.
ONE_PROGRAM = 'forceSingleInstance="on"'
JSON_TEMPLATE = ('template(name="zmqjson" type="string" string="{\\"message\\":\\"'
                 '%msg:::json%\\",\\"type\\":\\"syslog\\",\\"@pid\\":0}")')


def configs(endpoint: str) -> dict:
    """Mode name -> (modules, action) for PrivateRsyslog."""
    ship = f"{sys.executable} {ZMQPUSH} syslog -q -c {endpoint}"
    return {
        "omczmq (native)": (
            'module(load="omczmq")\n' + JSON_TEMPLATE,
            f'action(type="omczmq" endpoints=">{endpoint}" socktype="PUSH" template="zmqjson")'),
        "omprog -> zmqpush": (
            'module(load="omprog")',
            f'action(type="omprog" binary="{ship}" template="msgonly" {ONE_PROGRAM})'),
        "omprog -> zmqpush --batch": (
            'module(load="omprog")',
            f'action(type="omprog" binary="{ship} --batch" template="msgonly" {ONE_PROGRAM})'),
        "omprog -> zmqpush --batch, one per worker": (
            'module(load="omprog")',
            f'action(type="omprog" binary="{ship} --batch" template="msgonly")'),
    }


def cpu_seconds(pid: int) -> float:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICK


def run_once(mode: str, count: int, size: int) -> dict:
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    modules, action = configs(endpoint)[mode]
    sink = subprocess.Popen([sys.executable, str(HERE / "sink.py"), "--bind", endpoint,
                             "--quiet", "--count", str(count), "--idle", "15"],
                            stdout=subprocess.PIPE, text=True)
    with tempfile.TemporaryDirectory() as work:
        rs = PrivateRsyslog(Path(work), action, modules=modules).start()
        try:
            rs.send(["warmup"])
            time.sleep(1.0)
            body = "x" * max(0, size - 12)
            messages = [f"{i:010d} {body}" for i in range(count - 1)]
            began = time.monotonic()
            rs.send(messages)
            received = int(sink.communicate(timeout=300)[0].split()[1])
            took = time.monotonic() - began
            shippers = sum(cpu_seconds(pid) for pid in rs.children())
            rsyslogd = cpu_seconds(rs.proc.pid)
        finally:
            rs.stop()
    return {"msg/s": count / took, "received": received, "rsyslogd": rsyslogd,
            "zmqpush": shippers}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--size", type=int, default=200)
    p.add_argument("--runs", type=int, default=3)
    args = p.parse_args()
    modes = list(configs("tcp://x:1"))
    results = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode in modes:
            results[mode].append(run_once(mode, args.messages, args.size))
    print(f"{args.messages} messages of {args.size} bytes over TCP, median of {args.runs} "
          f"alternating runs, {os.cpu_count()} CPUs\n")
    print("| path | messages/s | ratio to omczmq | rsyslogd CPU-s | zmqpush CPU-s | received |")
    print("|---|---:|---:|---:|---:|---:|")
    base = statistics.median(r["msg/s"] for r in results[modes[0]])
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        print(f"| {mode} | {med['msg/s']:,.0f} | {med['msg/s'] / base:.2f} "
              f"| {med['rsyslogd']:.2f} | {med['zmqpush']:.2f} "
              f"| {min(r['received'] for r in runs):,} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
