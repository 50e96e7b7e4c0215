#!/usr/bin/env python3
"""Latency: time from a line written to zmqpush's stdin to its arrival at a receiver.

Writes each rate's lines/s for SECONDS, one write a line, each carrying its send time
(CLOCK_MONOTONIC, shared by processes on one machine); a PULL receiver in this
process notes arrival times.  Prints p50/p99/max for each --coalesce window (and
--batch at the default window), measured in the same run, rates in turn.
"""
import argparse
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import zmq

ZMQPUSH = str(Path(__file__).resolve().parent.parent / "zmqpush.py")


def measure(zmqpush: str, extra: list, rate: int, seconds: float) -> list:
    """Latencies in ms of rate*seconds lines shipped with zmqpush.py *extra."""
    count = int(rate * seconds)
    latencies = []
    bound = threading.Event()
    port = []

    def receive():
        sock = zmq.Context.instance().socket(zmq.PULL)
        port.append(sock.bind_to_random_port("tcp://127.0.0.1"))
        bound.set()
        while len(latencies) < count and sock.poll(5000):
            now = time.monotonic_ns()
            doc = json.loads(sock.recv())
            for event in doc if isinstance(doc, list) else [doc]:
                latencies.append((now - int(event["message"])) / 1e6)
        sock.close()

    receiver = threading.Thread(target=receive)
    receiver.start()
    bound.wait(5)
    port = port[0]
    proc = subprocess.Popen([sys.executable, zmqpush, "-q", "-c",
                             f"tcp://127.0.0.1:{port}", *extra],
                            stdin=subprocess.PIPE, stderr=subprocess.DEVNULL)
    time.sleep(1.0)
    interval = 1.0 / rate
    next_at = time.monotonic()
    for _ in range(count):
        next_at += interval
        time.sleep(max(0.0, next_at - time.monotonic()))
        proc.stdin.write(b"%d\n" % time.monotonic_ns())
        proc.stdin.flush()
    proc.stdin.close()
    proc.wait(30)
    receiver.join(30)
    return sorted(latencies)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rates", default="100,1000", help="lines/s, comma-separated")
    p.add_argument("--windows", default="0,0.005,0.01,0.02,0.05",
                   help="--coalesce values, comma-separated")
    p.add_argument("--seconds", type=float, default=5)
    p.add_argument("--zmqpush", default=ZMQPUSH,
                   help="the zmqpush.py to measure (default: the one beside bench/)")
    args = p.parse_args()
    modes = [(f"zmqpush --coalesce {w}", ["--coalesce", w]) for w in args.windows.split(",")]
    modes.append(("zmqpush --batch", ["--batch"]))
    print(f"Latency from write to arrival, one write a line, {args.seconds:g} s a rate\n")
    print("| lines/s | mode | lines | p50 ms | p99 ms | max ms |")
    print("|---:|---|---:|---:|---:|---:|")
    for rate in map(int, args.rates.split(",")):
        for name, extra in modes:
            lat = measure(args.zmqpush, extra, rate, args.seconds)
            p50, p99 = (lat[min(len(lat) - 1, int(q * len(lat)))] for q in (0.5, 0.99))
            print(f"| {rate:,} | {name} | {len(lat)} | {p50:.3f} | {p99:.3f} | "
                  f"{lat[-1]:.3f} |")
    print(f"\nCommand: `python bench/latency.py {' '.join(sys.argv[1:])}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
