#!/usr/bin/env python3
"""Start-up: wall time of `echo test | zmqpush.py` against `python3 -c 'import zmq'`.

All commands run RUNS times, alternating, with a receiver up; prints medians and
each one's ratio to `import zmq`.  The third row is the floor the design sets:
importing what zmqpush must load (asyncio, pyzmq, uvloop and aiozmq) and nothing else.
"""
import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import zmq

ZMQPUSH = str(Path(__file__).resolve().parent.parent / "zmqpush.py")


def wall(cmd: list, data: bytes) -> float:
    began = time.monotonic()
    subprocess.run(cmd, input=data, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.monotonic() - began


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    args = p.parse_args()
    sink = zmq.Context.instance().socket(zmq.PULL)
    port = sink.bind_to_random_port("tcp://127.0.0.1")
    commands = {
        "echo test \\| zmqpush.py": ([sys.executable, ZMQPUSH, "-c",
                                      f"tcp://127.0.0.1:{port}"], b"test\n"),
        "python3 -c 'import zmq'": ([sys.executable, "-c", "import zmq"], b""),
        "python3 -c 'import asyncio, zmq, uvloop, aiozmq'":
            ([sys.executable, "-c", "import asyncio, zmq, uvloop, aiozmq"], b""),
    }
    times = {name: [] for name in commands}
    for _ in range(args.runs):
        for name, (cmd, data) in commands.items():
            times[name].append(wall(cmd, data))
    medians = {name: statistics.median(v) * 1000 for name, v in times.items()}
    base = medians["python3 -c 'import zmq'"]
    print(f"{args.runs} alternating runs, medians\n")
    print("| command | ms | ratio to import zmq |\n|---|---:|---:|")
    for name, ms in medians.items():
        print(f"| {name} | {ms:.1f} | {ms / base:.2f} |")
    sink.close(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
