#!/usr/bin/env python3
"""Throughput at full speed: zmqpush against the naive pyzmq loop and the same job
in C, side by side in one run, each feeding one C counting receiver.

Every shipper reads the same realistic corpus (bench/corpus.py) from a pipe (`cat`)
and sends to bench/ccount.c in its own process, which only counts events (so the
receiver caps nobody) and stays connected until the shipper has exited.  Rows:
the C reference (bench/cship.c, one message per line and one JSON array per
read), the naive pyzmq loop (bench/naive.py), zmqpush in default and --batch
mode, each also with --replay-bytes 0.  Runs alternate between rows (A B C ...
A B C ...); the table shows medians of:

- shipper lines/s: from starting the shipper until it exits (having handed
  everything to the receiver's ZeroMQ), start-up included;
- end-to-end lines/s: from the same start until the receiver counted the last
  line (the time of its last frame, which can come before the shipper has
  finished exiting);
- each as a ratio to C one message per line, and for batch rows also to C array;
- CPU-s per 1M lines and peak RSS: the shipper's own (GNU time, whose small
  process forks it), start-up included; and the fewest events received in any run.

A last line gives the Python floor (bench/floor.py): the send rate of a loop that
only calls the Cython backend's send on pre-built messages, reading and encoding
excluded.  --validate uses bench/sink.py (strict JSON parse of every event) as the
receiver instead, to check validity: its rates are then capped by that receiver.
--curve compares zmqpush with CURVE off and on (keys made with zmqpush.py
--make-cert), receiver bench/sink.py, a CURVE server for the CURVE rows.
--multiline compares the plain mode with --multiline presets (joining on).
--corpus json ships JSON lines of a structured logger (bench/corpus.py --json)
instead, and adds the rows of zmqpush --json (README "Structured logs"): each
line parsed and merged into its event.  --corpus docker and --corpus cri ship the
text lines as Docker's json-file driver and CRI runtimes write them,
plain (each envelope line sent as text) against --docker or --cri.
"""
import argparse
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402
from cref import Counter, build  # noqa: E402
from ports import free_port  # noqa: E402

TIME = "/usr/bin/time"
C_LINE, C_ARRAY = "C, one message per line", "C, one array per read"
FLOOR = "Python floor: backend send of pre-built messages"


def rows(args, cship: str, certs: str) -> dict:
    """Row name -> argv of the shipper (ENDPOINT stands for the endpoint).  With
    --curve, zmqpush with CURVE off and on (rows ending in CURVE) instead of the
    replay rows; the keys are in certs."""
    zmqpush = [args.python, args.zmqpush, "-q"]
    if args.multiline:
        return {
            C_LINE: [cship, "ENDPOINT"],
            C_ARRAY: [cship, "ENDPOINT", "--array"],
            "zmqpush": [*zmqpush, "-c", "ENDPOINT"],
            "zmqpush --multiline python": [*zmqpush, "--multiline", "python", "-c", "ENDPOINT"],
            "zmqpush --multiline python,java,go,ruby": [
                *zmqpush, "--multiline", "python,java,go,ruby", "-c", "ENDPOINT"],
            "zmqpush --multiline python,java,go,ruby,php,node": [
                *zmqpush, "--multiline", "python,java,go,ruby,php,node", "-c", "ENDPOINT"],
            "zmqpush --batch": [*zmqpush, "--batch", "-c", "ENDPOINT"],
            "zmqpush --batch --multiline python": [*zmqpush, "--batch", "--multiline",
                                                   "python", "-c", "ENDPOINT"],
        }
    if args.curve:
        keys = ["--curve-server-cert", os.path.join(certs, "server.key"),
                "--curve-cert", os.path.join(certs, "client.key_secret")]
        return {
            C_LINE: [cship, "ENDPOINT"],
            C_ARRAY: [cship, "ENDPOINT", "--array"],
            "zmqpush": [*zmqpush, "-c", "ENDPOINT"],
            "zmqpush, CURVE": [*zmqpush, "-c", "ENDPOINT", *keys],
            "zmqpush --batch": [*zmqpush, "--batch", "-c", "ENDPOINT"],
            "zmqpush --batch, CURVE": [*zmqpush, "--batch", "-c", "ENDPOINT", *keys],
        }
    if args.corpus == "json":
        return {
            C_LINE: [cship, "ENDPOINT"],
            C_ARRAY: [cship, "ENDPOINT", "--array"],
            "zmqpush": [*zmqpush, "-c", "ENDPOINT"],
            "zmqpush --json": [*zmqpush, "--json", "-c", "ENDPOINT"],
            "zmqpush --batch": [*zmqpush, "--batch", "-c", "ENDPOINT"],
            "zmqpush --batch --json": [*zmqpush, "--batch", "--json", "-c", "ENDPOINT"],
        }
    if args.corpus in ("docker", "cri"):
        mode = f"--{args.corpus}"
        return {
            C_LINE: [cship, "ENDPOINT"],
            C_ARRAY: [cship, "ENDPOINT", "--array"],
            "zmqpush": [*zmqpush, "-c", "ENDPOINT"],
            f"zmqpush {mode}": [*zmqpush, mode, "-c", "ENDPOINT"],
            f"zmqpush {mode} --multiline python,java,go,ruby": [
                *zmqpush, mode, "--multiline", "python,java,go,ruby", "-c", "ENDPOINT"],
            "zmqpush --batch": [*zmqpush, "--batch", "-c", "ENDPOINT"],
            f"zmqpush --batch {mode}": [*zmqpush, "--batch", mode, "-c", "ENDPOINT"],
        }
    return {
        C_LINE: [cship, "ENDPOINT"],
        C_ARRAY: [cship, "ENDPOINT", "--array"],
        "naive pyzmq loop": [args.python, str(HERE / "naive.py"), "ENDPOINT"],
        "zmqpush": [*zmqpush, "-c", "ENDPOINT"],
        "zmqpush --batch": [*zmqpush, "--batch", "-c", "ENDPOINT"],
        "zmqpush --replay-bytes 0": [*zmqpush, "--replay-bytes", "0", "-c", "ENDPOINT"],
        "zmqpush --batch --replay-bytes 0": [*zmqpush, "--batch", "--replay-bytes", "0",
                                             "-c", "ENDPOINT"],
    }



def start_sink(lines: int, extra: list):
    """(process, endpoint) of bench/sink.py bound on 127.0.0.1, ending after lines."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = subprocess.Popen([sys.executable, str(HERE / "sink.py"), "--bind", endpoint,
                             "--quiet", "--count", str(lines), "--idle", "10", *extra],
                            stdout=subprocess.PIPE, text=True)
    time.sleep(0.5)
    return proc, endpoint


def run_once(argv: list, corpus: str, lines: int, validate: bool, sink_args: list) -> dict:
    """One shipment of the corpus; returns its measurements."""
    if validate:
        sink, endpoint = start_sink(lines, sink_args)
    else:  # merged JSON lines carry no "message": their first key is counted
        counter = Counter(lines, idle=10, needle='{"level":' if "--json" in argv else "")
        endpoint = counter.endpoint
    argv = [endpoint if a == "ENDPOINT" else a for a in argv]
    with open(corpus, "rb") as f, tempfile.NamedTemporaryFile("r") as usage, \
            tempfile.TemporaryFile("w+") as errors:
        began = time.monotonic()
        cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
        shipper = subprocess.Popen([TIME, "-o", usage.name, "-f", "%x %U %S %M", *argv],
                                   stdin=cat.stdout, stdout=subprocess.PIPE, stderr=errors,
                                   text=True)
        cat.stdout.close()
        out = shipper.communicate()[0]
        shipped = time.monotonic() - began
        cat.wait()
        status, user, system, rss_kib = usage.read().split()[-4:]
        if status != "0":
            errors.seek(0)
            print(f"{shlex.join(argv)} exited {status}: {errors.read()[-500:]}",
                  file=sys.stderr)
    if validate:
        try:
            summary = sink.communicate(timeout=120)[0]
        except subprocess.TimeoutExpired:
            sink.kill()
            summary = sink.communicate()[0]
        took = time.monotonic() - began
        found = re.search(r"received (\d+) events \((\d+) invalid\)", summary)
        received, invalid = (int(found[1]), int(found[2])) if found else (0, 0)
    else:
        count = counter.finish(timeout=120)
        took = count["last"] - began if count["last"] else float("inf")
        received, invalid = count["received"], 0
    sent = re.search(r"sent (\d+) messages in ([0-9.]+) s", out)
    return {"shipped/s": lines / shipped, "lines/s": lines / took,
            "cpu": (float(user) + float(system)) * 1e6 / lines,
            "rss": int(rss_kib) / 1024, "received": received, "invalid": invalid,
            "send/s": int(sent[1]) / float(sent[2]) if sent else 0.0}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--zmqpush", default=str(HERE.parent / "zmqpush.py"),
                   help="the zmqpush.py to measure (default: the one beside bench/)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for zmqpush, naive.py and floor.py (default: this one)")
    p.add_argument("--validate", action="store_true",
                   help="receiver bench/sink.py, strict JSON parse of every event")
    p.add_argument("--no-floor", action="store_true", help="leave out the Python floor")
    p.add_argument("--curve", action="store_true",
                   help="zmqpush with CURVE off and on (implies --validate: the receiver "
                   "is bench/sink.py, a CURVE server for the CURVE rows)")
    p.add_argument("--multiline", action="store_true",
                   help="zmqpush plain against --multiline presets on the same corpus "
                   "(README \"Multi-line events\")")
    p.add_argument("--corpus", choices=("text", "json", "docker", "cri"), default="text",
                   help="syslog-like text lines (default), or JSON lines with --json rows, "
                   "or text lines as container runtimes write them with --docker or --cri rows")
    args = p.parse_args()
    args.validate = args.validate or args.curve
    with tempfile.TemporaryDirectory() as tmp:
        shippers = rows(args, build("cship"), tmp)
        if not args.no_floor and not args.curve and not args.multiline:
            shippers[FLOOR] = [args.python, str(HERE / "floor.py"), "ENDPOINT"]
        for name in ("server", "client"):
            if args.curve:
                subprocess.run([args.python, args.zmqpush, "--make-cert",
                                os.path.join(tmp, name)], check=True, stdout=subprocess.DEVNULL)
        server = ["--curve-server", os.path.join(tmp, "server.key_secret")]
        corpus = os.path.join(tmp, "corpus.log")
        size = write_corpus(corpus, args.lines, kind=args.corpus)
        results = {name: [] for name in shippers}
        for _ in range(args.runs):
            for name, argv in shippers.items():
                results[name].append(run_once(argv, corpus, args.lines, args.validate,
                                              server if name.endswith("CURVE") else []))

    med = {name: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for name, runs in results.items()}
    receiver = "bench/sink.py (strict JSON parse)" if args.validate else "bench/ccount.c"
    print(f"{args.lines:,} {args.corpus} lines of {size / args.lines:.0f} bytes, median of "
          f"{args.runs} alternating runs, receiver {receiver}, {os.cpu_count()} CPUs, "
          f"zmqpush {args.zmqpush}\n")
    print("| shipper | shipper lines/s | ÷ C | ÷ C array | end-to-end lines/s | ÷ C "
          "| ÷ C array | CPU-s per 1M lines | peak RSS MiB | received |"
          + (" invalid |" if args.validate else ""))
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
          + ("---:|" if args.validate else ""))
    c_line, c_array = med[C_LINE], med[C_ARRAY]
    for name, m in med.items():
        if name == FLOOR:
            continue
        arrays = name == C_ARRAY or "--batch" in name
        cells = [name]
        for key in ("shipped/s", "lines/s"):
            cells += [f"{m[key]:,.0f}", f"{m[key] / c_line[key]:.2f}",
                      f"{m[key] / c_array[key]:.2f}" if arrays else ""]
        cells += [f"{m['cpu']:.2f}", f"{m['rss']:.1f}",
                  f"{min(r['received'] for r in results[name]):,}"]
        if args.validate:
            cells.append(str(max(r["invalid"] for r in results[name])))
        print("| " + " | ".join(cells) + " |")
    if FLOOR in med:
        floor = med[FLOOR]
        print(f"\n{FLOOR} (bench/floor.py; reading and encoding excluded, so not a "
              f"shipper): {floor['send/s']:,.0f} messages/s, "
              f"{floor['send/s'] / c_line['shipped/s']:.2f} times C one message per line's "
              f"shipper lines/s; received {min(r['received'] for r in results[FLOOR]):,}.")
    print("\n÷ C: ratio to \"C, one message per line\"; ÷ C array: to \"C, one array per "
          "read\" (batch rows).")
    script = os.path.relpath(__file__)
    print(f"Command: `{shlex.join(['python', script, *sys.argv[1:]])}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
