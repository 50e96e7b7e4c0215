#!/usr/bin/env python3
"""Start-up: wall time of `echo test | zmqpush.py` against `python3 -c 'import zmq'`.

All commands run RUNS times, alternating, with a receiver up; prints medians and
each one's ratio to `import zmq`.  Rows: the installed command (pip's install
of this checkout into a temporary directory: the launcher and the module's
bytecode), the script run from the checkout (compiled at every start), and the
floor the design sets: importing what zmqpush must load (asyncio, pyzmq,
uvloop and aiozmq) and nothing else.
"""
import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
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
    target = tempfile.mkdtemp()
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target",
                    target, str(Path(ZMQPUSH).parent)], check=True, capture_output=True)
    os.environ["PYTHONPATH"] = target
    commands = {
        "echo test \\| zmqpush.py (installed)": ([os.path.join(target, "bin", "zmqpush.py"),
                                                  "-c", f"tcp://127.0.0.1:{port}"], b"test\n"),
        "echo test \\| python3 zmqpush.py (checkout)": ([sys.executable, ZMQPUSH, "-c",
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
    shutil.rmtree(target)
    return 0


if __name__ == "__main__":
    sys.exit(main())
