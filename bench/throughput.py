#!/usr/bin/env python3
"""Throughput: zmqpush (default and --batch, replay window on and off) against the
naive pyzmq loop, in one run; with --curve, zmqpush with CURVE off and on instead.

Each shipper reads the same realistic corpus (bench/corpus.py) from a pipe and sends
to bench/sink.py in another process, which validates every event with a strict JSON
parse.  Runs alternate between modes; the table shows medians of: shipper lines/s
(start until the shipper exits, having handed everything to the receiver's ZeroMQ),
end-to-end lines/s (until the receiver has validated the last event: this Python
receiver caps it), each with its ratio to the naive loop, shipper CPU-seconds per
million lines, shipper peak RSS, and events received and invalid.
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
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402

PY = sys.executable
TIME = "/usr/bin/time"
MODES = {
    "naive pyzmq loop": lambda ep: [PY, str(HERE / "naive.py"), ep],
    "zmqpush": lambda ep: [PY, str(HERE.parent / "zmqpush.py"), "-q", "-c", ep],
    "zmqpush --replay-bytes 0": lambda ep: [PY, str(HERE.parent / "zmqpush.py"), "-q",
                                            "--replay-bytes", "0", "-c", ep],
    "zmqpush --batch": lambda ep: [PY, str(HERE.parent / "zmqpush.py"), "-q", "--batch",
                                   "-c", ep],
    "zmqpush --batch --replay-bytes 0": lambda ep: [PY, str(HERE.parent / "zmqpush.py"),
                                                    "-q", "--batch", "--replay-bytes", "0",
                                                    "-c", ep],
}


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# --curve: the same shipper with CURVE off and on, against a sink that is a CURVE
# server when it is on (keys made by zmqpush.py --make-cert in CERTS, set by main).
CERTS = ""


def curve_args() -> list:
    return ["--curve-server-cert", os.path.join(CERTS, "server.key"),
            "--curve-cert", os.path.join(CERTS, "client.key_secret")]


CURVE_MODES = {
    "naive pyzmq loop": MODES["naive pyzmq loop"],
    "zmqpush": MODES["zmqpush"],
    "zmqpush, CURVE": lambda ep: [*MODES["zmqpush"](ep), *curve_args()],
    "zmqpush --batch": MODES["zmqpush --batch"],
    "zmqpush --batch, CURVE": lambda ep: [*MODES["zmqpush --batch"](ep), *curve_args()],
}
ALL_MODES = {**MODES, **CURVE_MODES}


def run_once(mode: str, corpus: str, lines: int) -> dict:
    """One shipment of the corpus; returns its measurements."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    curve = ["--curve-server", os.path.join(CERTS, "server.key_secret")] \
        if mode.endswith("CURVE") else []
    sink = subprocess.Popen([PY, str(HERE / "sink.py"), "--bind", endpoint, "--quiet",
                             "--count", str(lines), "--idle", "10", *curve],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    with tempfile.NamedTemporaryFile("r") as usage, open(corpus, "rb") as f:
        began = time.monotonic()
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
        # GNU time measures the shipper alone: its own small process forks it.
        shipper = subprocess.Popen([TIME, "-o", usage.name, "-f", "%U %S %M",
                                    *ALL_MODES[mode](endpoint)],
                                   stdin=cat.stdout, stderr=subprocess.DEVNULL)
        cat.stdout.close()
        shipper.wait()
        shipped = time.monotonic() - began
        summary = sink.communicate(timeout=120)[0].split()
        took = time.monotonic() - began
        user, system, rss_kib = usage.read().split()[-3:]
    cat.wait()
    received, invalid = int(summary[1]), int(summary[3].strip("("))
    return {"shipped/s": lines / shipped, "lines/s": lines / took,
            "cpu": (float(user) + float(system)) * 1e6 / lines,
            "rss": int(rss_kib) / 1024, "received": received, "invalid": invalid,
            "exit": shipper.returncode}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=500_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--curve", action="store_true", help="compare CURVE off and on")
    args = p.parse_args()
    modes = CURVE_MODES if args.curve else MODES
    global CERTS  # noqa: PLW0603
    with tempfile.TemporaryDirectory() as tmp:
        CERTS = tmp
        for name in ("server", "client"):
            subprocess.run([PY, str(HERE.parent / "zmqpush.py"), "--make-cert",
                            os.path.join(tmp, name)], check=True, stdout=subprocess.DEVNULL)
        corpus = os.path.join(tmp, "corpus.log")
        size = write_corpus(corpus, args.lines)
        results = {mode: [] for mode in modes}
        for _ in range(args.runs):
            for mode in modes:
                results[mode].append(run_once(mode, corpus, args.lines))
    print(f"{args.lines} lines of {size / args.lines:.0f} bytes, median of {args.runs} "
          f"alternating runs, {os.cpu_count()} CPUs\n")
    print("| shipper | shipper lines/s | ratio | end-to-end lines/s | ratio "
          "| CPU-s per 1M lines | peak RSS MiB | received | invalid |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    naive = results["naive pyzmq loop"]
    base = {k: statistics.median(r[k] for r in naive) for k in ("shipped/s", "lines/s")}
    for mode, runs in results.items():
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        shipped = med["shipped/s"]
        print(f"| {mode} | {shipped:,.0f} | {shipped / base['shipped/s']:.2f} "
              f"| {med['lines/s']:,.0f} | {med['lines/s'] / base['lines/s']:.2f} "
              f"| {med['cpu']:.2f} | {med['rss']:.1f} | {min(r['received'] for r in runs):,} "
              f"| {max(r['invalid'] for r in runs)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
