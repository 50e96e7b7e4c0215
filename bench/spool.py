#!/usr/bin/env python3
"""What the disk spool costs: zmqpush without one against --spool DIR with
--spool-sync never, 1 (the default) and write, side by side in one run.

Every row reads the same realistic corpus (bench/corpus.py) and sends to one C
counting receiver (bench/ccount.c) in its own process; each spool run gets a
new empty spool directory under --dir (its file system is named in the
header: fdatasync costs what that device makes it cost).  Runs alternate
between rows (A B C D A B C D ...); the table shows medians of --runs:

- receiver up, full speed: the corpus from a pipe (`cat`); shipper lines/s from
  starting zmqpush until it exits having handed everything over (start-up
  included), as a ratio to the row without a spool; zmqpush's CPU-s per 1M
  lines and peak RSS (GNU time, start-up included).  Every line still goes
  through the spool (written, then deleted once delivered); the spool must be
  empty after each run.
- receiver down, full speed (spool rows only; without one the producer
  blocks once the queue is full): the same input with nothing listening and
  --linger 0.5, so every line stays in the spool.  Producer lines/s: from
  starting zmqpush until `cat` has written the whole corpus into the pipe (so
  all but its last 64 KiB was read and spooled); zmqpush's CPU-s per 1M lines;
  spool bytes per line: the .seg files' sizes after it exited, over the lines
  (the corpus's own bytes per line are in the header).
- paced: --rate lines/s (default 1,000), one os.write() per line, receiver up,
  as bench/paced.py feeds and measures it: zmqpush's %CPU of one core over a
  --paced-seconds steady window after 1 s of warm-up, and its context
  switches per second.  This is where --spool-sync write pays one fdatasync
  per line (a record per read, and each read here is about one line).

Peak RSS is lower with a spool: its replay window keeps positions on disk, where
without one the window (16 MiB by default) holds the messages in memory.
"""
import argparse
import math
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402
from cref import Counter  # noqa: E402
from paced import LOADS  # noqa: E402
from paced import measure as paced_measure  # noqa: E402
from ports import free_port  # noqa: E402

TIME = "/usr/bin/time"
RATES = sorted({rate for rate, per_write in LOADS if per_write == 1})  # paced.py's
OFF = "spool off"
# Row name -> zmqpush options (SPOOL stands for the run's spool directory).
ROWS = {
    OFF: [],
    "--spool-sync never": ["--spool", "SPOOL", "--spool-sync", "never"],
    "--spool-sync 1 (default)": ["--spool", "SPOOL"],
    "--spool-sync write": ["--spool", "SPOOL", "--spool-sync", "write"],
}
SPOOL_CAP = 1 << 30  # zmqpush's default --spool-bytes
SPOOL_BYTES_PER_LINE = 400  # generous: above it the cap is raised for big --lines



def filesystem(path: str) -> str:
    """'TYPE on MOUNTPOINT (DEVICE)' of the mount that holds path."""
    best = ("?", "/", "?")
    real = os.path.realpath(path)
    with open("/proc/mounts") as mounts:
        for row in mounts:
            device, mount, kind = row.split()[:3]
            if (real == mount or real.startswith(mount.rstrip("/") + "/")) \
                    and len(mount) >= len(best[1]):
                best = (kind, mount, device)
    return f"{best[0]} on {best[1]} ({best[2]})"


class Runner:
    def __init__(self, args, corpus: str):
        self.args = args
        self.corpus = corpus
        self.base = [args.python, args.zmqpush, "-q"]
        cap = max(SPOOL_CAP, args.lines * SPOOL_BYTES_PER_LINE)
        self.cap = [] if cap == SPOOL_CAP else ["--spool-bytes", str(cap)]

    def argv(self, options: list, spool: str, endpoint: str, *extra) -> list:
        options = [spool if o == "SPOOL" else o for o in options]
        if spool:
            options += self.cap
        return [*self.base, *options, *extra, "-c", endpoint]

    def spool_dir(self, options: list) -> str:
        return tempfile.mkdtemp(prefix="spool-", dir=self.args.dir) if options else ""

    def ship(self, argv: list) -> tuple:
        """cat corpus | GNU time argv; returns (seconds until cat exited, seconds
        until argv exited, exit status, CPU-s, peak RSS KiB, stderr tail)."""
        with open(self.corpus, "rb") as f, tempfile.NamedTemporaryFile("r") as usage, \
                tempfile.TemporaryFile("w+") as errors:
            began = time.monotonic()
            cat = subprocess.Popen(["cat"], stdin=f, stdout=subprocess.PIPE)
            shipper = subprocess.Popen([TIME, "-o", usage.name, "-f", "%x %U %S %M", *argv],
                                       stdin=cat.stdout, stdout=subprocess.DEVNULL,
                                       stderr=errors)
            cat.stdout.close()
            cat.wait()
            produced = time.monotonic() - began
            shipper.wait()
            shipped = time.monotonic() - began
            status, user, system, rss_kib = usage.read().split()[-4:]
            errors.seek(0)
            return (produced, shipped, int(status), float(user) + float(system),
                    int(rss_kib), errors.read()[-500:])

    def up(self, options: list) -> dict:
        """Receiver up, full speed."""
        lines = self.args.lines
        counter = Counter(lines, idle=10)
        spool = self.spool_dir(options)
        try:
            argv = self.argv(options, spool, counter.endpoint)
            _, shipped, status, cpu, rss, err = self.ship(argv)
            received = counter.finish(timeout=120)["received"]
            if status != 0:
                print(f"{shlex.join(argv)} exited {status}: {err}", file=sys.stderr)
            left = sorted(set(os.listdir(spool)) - {"lock", "position"}) if spool else []
            if left:
                print(f"{shlex.join(argv)} left {left} in its spool", file=sys.stderr)
        finally:
            if spool:
                shutil.rmtree(spool)
        return {"lines/s": lines / shipped, "cpu": cpu * 1e6 / lines, "rss": rss / 1024,
                "received": received, "clean": status == 0 and not left}

    def down(self, options: list) -> dict:
        """Receiver down, full speed: every line stays in the spool."""
        lines = self.args.lines
        spool = self.spool_dir(options)
        try:
            argv = self.argv(options, spool, f"tcp://127.0.0.1:{free_port()}",
                             "--linger", "0.5")
            produced, _, status, cpu, _, err = self.ship(argv)
            if status != 3:  # 3: bytes stay in the spool, as they should
                print(f"{shlex.join(argv)} exited {status}: {err}", file=sys.stderr)
            spooled = sum(p.stat().st_size for p in Path(spool).glob("*.seg"))
        finally:
            shutil.rmtree(spool)
        return {"lines/s": lines / produced, "cpu": cpu * 1e6 / lines,
                "bytes": spooled / lines}

    def paced(self, options: list) -> dict:
        """--rate lines/s, one write per line (bench/paced.py's measure)."""
        spool = self.spool_dir(options)
        try:
            return paced_measure(self.argv(options, spool, "ENDPOINT"), self.args.rate, 1,
                                 self.args.paced_seconds)
        finally:
            if spool:
                shutil.rmtree(spool)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=500_000, help="corpus lines at full speed")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--rate", type=int, default=1000, choices=sorted(RATES),
                   help="paced lines/s (lines per write as bench/paced.py: 1 up to 1,000)")
    p.add_argument("--paced-seconds", type=float, default=3.0,
                   help="steady window of each paced measurement")
    p.add_argument("--no-down", action="store_true", help="leave out the receiver-down runs")
    p.add_argument("--no-paced", action="store_true", help="leave out the paced runs")
    p.add_argument("--dir", default=tempfile.gettempdir(),
                   help="where the spool directories go (default: the temporary directory)")
    p.add_argument("--zmqpush", default=str(HERE.parent / "zmqpush.py"),
                   help="the zmqpush.py to measure (default: the one beside bench/)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for zmqpush (default: this one)")
    args = p.parse_args()
    results = {(kind, name): [] for kind in ("up", "down", "paced") for name in ROWS}
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.log")
        size = write_corpus(corpus, args.lines)
        runner = Runner(args, corpus)
        for _ in range(args.runs):
            for name, options in ROWS.items():
                results["up", name].append(runner.up(options))
            for name, options in ROWS.items():
                if options and not args.no_down:
                    results["down", name].append(runner.down(options))
            for name, options in ROWS.items():
                if not args.no_paced:
                    results["paced", name].append(runner.paced(options))

    def med(kind: str, name: str, key: str) -> float:
        runs = results[kind, name]
        return statistics.median(r[key] for r in runs) if runs else float("nan")

    def cell(value: float, form: str) -> str:
        return "-" if math.isnan(value) else format(value, form)  # NaN: not measured

    print(f"{args.lines:,} lines of {size / args.lines:.0f} bytes at full speed; paced "
          f"{args.rate:,} lines/s, one write per line, {args.paced_seconds:g} s window; "
          f"median of {args.runs} alternating runs, receiver bench/ccount.c, "
          f"{os.cpu_count()} CPUs; spool in {args.dir}: {filesystem(args.dir)}; "
          f"zmqpush {args.zmqpush}\n")
    print("| zmqpush | up: lines/s | ÷ off | up: CPU-s per 1M lines | up: peak RSS MiB "
          "| down: producer lines/s | down: CPU-s per 1M lines | spool bytes per line "
          f"| paced {args.rate:,}/s: %CPU | ÷ off | paced: switches/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    off_rate, off_cpu = med("up", OFF, "lines/s"), med("paced", OFF, "cpu")
    for name in ROWS:
        rate, paced_cpu = med("up", name, "lines/s"), med("paced", name, "cpu")
        cells = [name, cell(rate, ",.0f"), cell(rate / off_rate, ".2f"),
                 cell(med("up", name, "cpu"), ".2f"), cell(med("up", name, "rss"), ".1f"),
                 cell(med("down", name, "lines/s"), ",.0f"),
                 cell(med("down", name, "cpu"), ".2f"), cell(med("down", name, "bytes"), ".0f"),
                 cell(paced_cpu, ".2f"), cell(paced_cpu / off_cpu, ".2f"),
                 cell(med("paced", name, "cs"), ",.0f")]
        print("| " + " | ".join(cells) + " |")
    short = [f"{kind} {name}: received {r['received']:,} of {r.get('fed', args.lines):,}"
             for (kind, name), runs in results.items() for r in runs
             if "received" in r and r["received"] != r.get("fed", args.lines)]
    unclean = sum(not r["clean"] for (kind, _), runs in results.items() if kind == "up"
                  for r in runs)
    print()
    for text in short:
        print(f"LOST: {text}")
    if not short:
        print("Received: every line, in every receiver-up and paced run.")
    if unclean:
        print(f"{unclean} receiver-up runs exited non-zero or left records in the spool.")
    print("÷ off: ratio to the row without a spool. up: receiver up; down: receiver down "
          "(nothing is sent: how fast the producer gets its lines into the spool).")
    script = os.path.relpath(__file__)
    print(f"Command: `{shlex.join(['python', script, *sys.argv[1:]])}`")
    return 0


if __name__ == "__main__":
    sys.exit(main())
