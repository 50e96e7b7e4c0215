#!/usr/bin/env python3
"""Instructions a line at a trickle: each shipper under valgrind's callgrind.

    python bench/instructions.py [--lines 400] [--zmqpush PATH ...]

Each shipper (zmqpush, bench/skeleton.py and its --bare form, the naive loop
bench/naive.py, C bench/cship.c) runs twice under `valgrind --tool=callgrind`
(all threads counted), sending to bench/ccount.c: once fed --lines corpus
lines, one write() each, 20 a second (so every line wakes the shipper on its
own, as at low rates), once fed none; both wait the same start-up time before
the feed and close stdin the same time after it.  The difference divided by
--lines is what one line costs, start-up and exit excluded.

Instruction counts do not depend on what else the machine does (the two runs
of a pair go side by side), so this table is the one to compare across
versions; what a line costs in time also depends on cache misses, which only
the %CPU benches (bench/paced.py, bench/pidstat.py) see.  Needs valgrind.
"""
import argparse
import glob
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import line  # noqa: E402
from cref import Counter, build  # noqa: E402

START_UP = 25.0  # seconds under valgrind before the first line
RATE = 20  # lines a second


def instructions(argv: list, lines: int, feed_seconds: float) -> int:
    """Instructions the shipper ran, all threads, fed `lines` lines (over at
    most feed_seconds, waited out in full either way)."""
    counter = Counter(max(lines, 1), idle=START_UP + feed_seconds + 120)  # slow under valgrind
    argv = [counter.endpoint if a == "ENDPOINT" else a for a in argv]
    rnd = random.Random(5)
    with tempfile.TemporaryDirectory() as out:
        read_end, write_end = os.pipe()
        proc = subprocess.Popen(["valgrind", "--tool=callgrind",
                                 f"--callgrind-out-file={out}/callgrind.%p", *argv],
                                stdin=read_end, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
        os.close(read_end)
        time.sleep(START_UP)
        for n in range(lines):
            os.write(write_end, line(rnd, n) + b"\n")
            time.sleep(1 / RATE)
        time.sleep(1 + feed_seconds - lines / RATE)  # both runs of a pair last as long
        os.close(write_end)
        proc.wait()
        received = counter.finish(timeout=60)["received"]
        if lines and received != lines:
            raise RuntimeError(f"{shlex.join(argv)}: received {received} of {lines}")
        total = 0
        for path in glob.glob(f"{out}/callgrind.*"):
            with open(path) as dump:
                for row in dump:
                    if row.startswith(("summary:", "totals:")):
                        total += int(row.split()[1])
                        break
        return total


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=400, help="lines fed")
    p.add_argument("--zmqpush", action="append",
                   help="a zmqpush.py to measure (repeatable; default: the one beside bench/)")
    p.add_argument("--python", default=sys.executable)
    args = p.parse_args()
    if not shutil.which("valgrind"):
        print("valgrind is missing: apt-get install valgrind", file=sys.stderr)
        return 2
    lines = max(1, args.lines)
    shippers = {f"zmqpush {path}" if args.zmqpush else "zmqpush":
                [args.python, path, "-q", "--linger", "60", "-c", "ENDPOINT"]
                for path in (args.zmqpush or [str(HERE.parent / "zmqpush.py")])}
    shippers.update({
        "skeleton": [args.python, str(HERE / "skeleton.py"), "ENDPOINT"],
        "bare asyncio": [args.python, str(HERE / "skeleton.py"), "--bare", "ENDPOINT"],
        "naive": [args.python, str(HERE / "naive.py"), "ENDPOINT"],
        "C": [build("cship"), "ENDPOINT"],
    })
    per_line = {}
    with ThreadPoolExecutor(2) as pool:
        for name, argv in shippers.items():
            fed, none = pool.map(lambda n, a=argv: instructions(a, n, lines / RATE), (lines, 0))
            per_line[name] = (fed - none) / lines
    naive = per_line["naive"]
    print(f"Instructions a line (callgrind, all threads), {lines} corpus lines at "
          f"{RATE} lines/s, one write() each, start-up and exit subtracted\n")
    print("| shipper | instructions a line | ratio to naive |")
    print("|---|---:|---:|")
    for name, count in per_line.items():
        print(f"| {name} | {count:,.0f} | {count / naive:.2f} |")
    script = os.path.relpath(__file__)
    print(f"\nCommand: `{shlex.join(['python', script, *sys.argv[1:]])}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
