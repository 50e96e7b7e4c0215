#!/usr/bin/env python3
"""Start-up: wall time of `echo test | zmqpush.py` against `python3 -c 'import zmq'`.

Both run RUNS times, alternating, with a receiver up; prints medians and the ratio.
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
    ship = [sys.executable, ZMQPUSH, "-c", f"tcp://127.0.0.1:{port}"]
    bare = [sys.executable, "-c", "import zmq"]
    times = {"echo test | zmqpush.py": [], "python3 -c 'import zmq'": []}
    for _ in range(args.runs):
        times["echo test | zmqpush.py"].append(wall(ship, b"test\n"))
        times["python3 -c 'import zmq'"].append(wall(bare, b""))
    zmqpush, base = (statistics.median(v) * 1000 for v in times.values())
    print("| command | median ms |\n|---|---:|")
    print(f"| echo test \\| zmqpush.py | {zmqpush:.1f} |\n| python3 -c 'import zmq' | {base:.1f} |")
    print(f"\nratio {zmqpush / base:.2f} ({args.runs} alternating runs)")
    sink.close(linger=0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
