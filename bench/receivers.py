#!/usr/bin/env python3
"""Cost per receiver: zmqpush with 1, 4, 16, 64, 256 `-c` endpoints at full speed.

One bench/ccount.c process binds as many ports as there are receivers
(CCOUNT_BINDS) and counts every event, staying connected until zmqpush exited;
zmqpush connects one PUSH socket to each and reads the realistic corpus
(bench/corpus.py) from a pipe.  While it runs its /proc entry is looked at
every 20 ms (the most threads and open descriptors seen, and VmHWM, its peak
RSS, at the last look); CPU comes from wait4().  Runs alternate between the
zmqpush files given (--zmqpush, repeated: e.g. the code before a change and
after) and between receiver counts; the table shows medians.  Sized for 2
cores: 300,000 lines a run.  A --zmqpush in a bin/ directory is an installed
command (a venv's launcher, which imports the module pip compiled) and runs as
it is; another file runs with --python, which compiles it first (about 15 MiB
more at the peak: see bench/README.md "Many receivers").
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402
from cref import build  # noqa: E402


def start_counter(receivers: int, lines: int) -> tuple:
    """A ccount bound on `receivers` free ports: (process, endpoints)."""
    proc = subprocess.Popen([build("ccount"), "tcp://127.0.0.1:*", str(lines), "20", "--stay"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, CCOUNT_BINDS=str(receivers)))
    endpoints = [proc.stderr.readline().split()[2] for _ in range(receivers)]
    return proc, endpoints


def watch(pid: int, most: dict, stop: threading.Event):
    """Keep in most the highest Threads, descriptor count and VmHWM (peak RSS)
    /proc shows for pid."""
    while not stop.wait(0.02):
        try:
            with open(f"/proc/{pid}/status") as status:
                rows = dict(row.split(":", 1) for row in status)
            threads, hwm = int(rows["Threads"]), int(rows["VmHWM"].split()[0])
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except (OSError, KeyError, ValueError):
            return
        most["threads"] = max(most["threads"], threads)
        most["fds"] = max(most["fds"], fds)
        most["hwm"] = max(most["hwm"], hwm)


def run(zmqpush: list, corpus: str, lines: int, receivers: int) -> dict:
    """One run of the zmqpush argv: lines/s (from start until zmqpush exits,
    all handed over), CPU-s per 1M lines, peak RSS MiB, most threads and
    descriptors, events received."""
    counter, endpoints = start_counter(receivers, lines)
    argv = zmqpush + [arg for e in endpoints for arg in ("-c", e)]
    began = time.monotonic()
    with open(corpus, "rb") as source:
        cat = subprocess.Popen(["cat"], stdin=source, stdout=subprocess.PIPE)
        proc = subprocess.Popen(argv, stdin=cat.stdout)
        cat.stdout.close()
    most, stop = {"threads": 0, "fds": 0, "hwm": 0}, threading.Event()
    watcher = threading.Thread(target=watch, args=(proc.pid, most, stop))
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stop.set()
    watcher.join()
    ended = time.monotonic()
    cat.wait()
    counter.terminate()
    out, _ = counter.communicate(timeout=60)
    received = int(out.split()[1]) if out.startswith("received") else 0
    return {"lines/s": lines / (ended - began),
            "CPU-s per 1M lines": (usage.ru_utime + usage.ru_stime) * 1e6 / lines,
            "peak RSS MiB": most["hwm"] / 1024, "threads": most["threads"],
            "descriptors": most["fds"], "received": received, "exit": proc.returncode}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zmqpush", action="append", help="zmqpush file (repeat to compare)")
    p.add_argument("--receivers", type=int, nargs="+", default=[1, 4, 16, 64, 256])
    p.add_argument("--lines", type=int, default=300_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--corpus", choices=("text", "json"), default="text")
    p.add_argument("--options", default="", help="zmqpush's further options, e.g. --batch")
    args = p.parse_args()
    files = args.zmqpush or [str(HERE.parent / "zmqpush.py")]
    results: dict = {}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus")
        write_corpus(corpus, args.lines, kind=args.corpus)
        for _ in range(args.runs):
            for receivers in args.receivers:
                for path in files:
                    command = [path] if Path(path).parent.name == "bin" else [args.python, path]
                    argv = [*command, "-q", *args.options.split()]
                    got = run(argv, corpus, args.lines, receivers)
                    results.setdefault((path, receivers), []).append(got)
    keys = ["lines/s", "CPU-s per 1M lines", "peak RSS MiB", "threads", "descriptors"]
    kind = "JSON lines of about 186" if args.corpus == "json" else "lines of about 112"
    print(f"{args.lines:,} {kind} bytes, zmqpush {args.options or 'at its defaults'}, median "
          f"of {args.runs} alternating runs, one bench/ccount.c bound on every receiver's "
          "port, 2 CPUs\n")
    print("| zmqpush | receivers | " + " | ".join(keys) + " | lines/s, all runs | received |")
    print("|---|---:|" + "---:|" * len(keys) + "---|---:|")
    for (path, receivers), runs in results.items():
        cells = [statistics.median(r[k] for r in runs) for k in keys]
        text = [f"{cells[0]:,.0f}", f"{cells[1]:.2f}", f"{cells[2]:.1f}",
                f"{cells[3]:.0f}", f"{cells[4]:.0f}"]
        spread = ", ".join(f"{r['lines/s'] / 1000:.0f}k" for r in runs)
        received = min(r["received"] for r in runs)
        print(f"| {path} | {receivers} | " + " | ".join(text) + f" | {spread} | {received:,} |")
    print(f"\nCommand: `python bench/receivers.py {' '.join(sys.argv[1:])}`")


if __name__ == "__main__":
    main()
