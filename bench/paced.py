#!/usr/bin/env python3
"""CPU at paced rates: zmqpush against the naive pyzmq loop and the same job in C.

A feeder process writes corpus lines (bench/corpus.py, about 110 bytes) into the
shipper's stdin pipe on an absolute clock (next += interval; sleep(next - now)),
so the rate is exact: 100, 1,000 and 10,000 lines/s with one os.write() per line
(a line-buffered program), and 10,000 lines/s with 10 lines per write (1,000
writes/s).  Each shipper (zmqpush -q at its default --coalesce window and at 0,
the naive loop bench/naive.py, C bench/cship.c one message per line, optionally
zmqpush --batch) sends to one C counting receiver (bench/ccount.c), which must
count every line fed.  Two yardsticks run beside them (bench/skeleton.py): the
design's shape with none of zmqpush's work ("skeleton": uvloop, the epoll
reader coroutine, an asyncio.Queue, the sender coroutine), and the cheapest
asyncio program for the job ("bare asyncio": one coroutine woken by the loop).

Measured: the shipper's own CPU over the steady window only, from /proc/PID/stat
utime+stime (all its threads; 10 ms ticks) read 1 s after the feeder starts
(start-up excluded) and again --seconds later, as %CPU of one core; and its
context switches per second over the same window, voluntary plus involuntary,
summed over all its threads (/proc/PID/task/*/status).  Runs alternate between
shippers (A B C A B C ...) within each rate; medians of --runs.
"""
import argparse
import os
import random
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import line  # noqa: E402
from cref import Counter, build  # noqa: E402

WARMUP = 1.0  # seconds from the feeder's start to the window's start
TAIL = 0.5  # seconds the feeder goes on after the window
TICK = os.sysconf("SC_CLK_TCK")
# (lines/s, lines per write)
LOADS = [(100, 1), (1000, 1), (10000, 1), (10000, 10)]
# --bursts: the Stats table's high load as rsyslog hands it over (bench/pidstat.py:
# `seq 1 100 | logger` every 0.2 s), 100 lines in one write 5 times a second, so that
# every shipper reads a burst at one wake-up and only the work per line differs.
BURSTS = [(500, 100)]


def feed(rate: int, per_write: int, writes: int) -> int:
    """Write `writes` chunks of per_write lines to stdout at rate lines/s."""
    rnd = random.Random(3)
    pool = [b"".join(line(rnd, n * per_write + k) + b"\n" for k in range(per_write))
            for n in range(min(writes, 1000))]
    interval = per_write / rate
    out, sleep, now = sys.stdout.fileno(), time.sleep, time.monotonic
    due = now()
    for n in range(writes):
        wait = due - now()
        if wait > 0:
            sleep(wait)
        os.write(out, pool[n % len(pool)])
        due += interval
    return 0


def cpu_ticks(pid: int) -> int:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def main_thread_ticks(pid: int) -> int:
    """utime+stime of pid's main thread (the one that reads and sends)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])


def switches(pid: int) -> int:
    """Voluntary plus involuntary context switches of all pid's threads."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            for row in (task / "status").read_text().splitlines():
                if row.startswith(("voluntary_ctxt_switches:", "nonvoluntary_ctxt_switches:")):
                    total += int(row.split()[1])
        except OSError:
            pass
    return total


def stop(proc: subprocess.Popen, timeout: float):
    """Wait for proc; past timeout, kill it (it is ours, by PID)."""
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def measure(argv: list, rate: int, per_write: int, seconds: float) -> dict:
    writes = round((WARMUP + seconds + TAIL) * rate / per_write)
    lines = writes * per_write
    counter = Counter(lines, idle=3)
    argv = [counter.endpoint if a == "ENDPOINT" else a for a in argv]
    with tempfile.TemporaryFile("w+") as errors:
        feeder = subprocess.Popen([sys.executable, __file__, "--feed", str(rate),
                                   str(per_write), str(writes)],
                                  stdout=subprocess.PIPE)
        shipper = subprocess.Popen(argv, stdin=feeder.stdout, stdout=subprocess.DEVNULL,
                                   stderr=errors)
        feeder.stdout.close()
        began = time.monotonic()
        time.sleep(WARMUP)
        t0, cpu0, cs0 = time.monotonic(), cpu_ticks(shipper.pid), switches(shipper.pid)
        main0 = main_thread_ticks(shipper.pid)
        time.sleep(max(0.0, began + WARMUP + seconds - time.monotonic()))
        t1, cpu1, cs1 = time.monotonic(), cpu_ticks(shipper.pid), switches(shipper.pid)
        main1 = main_thread_ticks(shipper.pid)
        stop(feeder, TAIL + 10)
        stop(shipper, 15)
        received = counter.finish(timeout=5)["received"]
        if shipper.returncode:
            errors.seek(0)
            print(f"{shlex.join(argv)} exited {shipper.returncode}: {errors.read()[-500:]}",
                  file=sys.stderr)
    window = t1 - t0
    return {"cpu": 100.0 * (cpu1 - cpu0) / TICK / window, "cs": (cs1 - cs0) / window,
            "main": 100.0 * (main1 - main0) / TICK / window,
            "fed": lines, "received": received}


def main() -> int:
    if sys.argv[1:2] == ["--feed"]:
        return feed(*map(int, sys.argv[2:5]))
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=20, help="steady window per measurement")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--batch", action="store_true", help="also zmqpush --batch")
    p.add_argument("--zmqpush", default=str(HERE.parent / "zmqpush.py"),
                   help="the zmqpush.py to measure (default: the one beside bench/)")
    p.add_argument("--python", default=sys.executable,
                   help="interpreter for zmqpush and naive.py (default: this one)")
    p.add_argument("--windows", default="",
                   help="also zmqpush at these --coalesce windows (comma-separated seconds)")
    p.add_argument("--bursts", action="store_true",
                   help="measure only 500 lines/s in writes of 100 lines (rsyslog's bursts "
                   "in the Stats table's high load), with the main thread's share")
    p.add_argument("--chart", metavar="PNG",
                   help="also draw %%CPU against load for each shipper into PNG "
                   "(needs matplotlib: pip install '.[bench]')")
    p.add_argument("--rates", default="",
                   help="measure only these lines/s (comma-separated, of 100, 1000, 10000; "
                   "a quick run: --seconds 5 --runs 1 --rates 1000 takes under a minute)")
    args = p.parse_args()
    loads = BURSTS if args.bursts else LOADS
    if args.rates:
        loads = [load for load in loads if str(load[0]) in args.rates.split(",")]
        if not loads or args.chart:
            p.error("--rates takes some of 100, 1000, 10000, and no --chart")
    shippers = {
        "zmqpush": [args.python, args.zmqpush, "-q", "-c", "ENDPOINT"],
        "zmqpush --coalesce 0": [args.python, args.zmqpush, "-q", "--coalesce", "0",
                                 "-c", "ENDPOINT"],
        "naive": [args.python, str(HERE / "naive.py"), "ENDPOINT"],
        "C": [build("cship"), "ENDPOINT"],
        "skeleton": [args.python, str(HERE / "skeleton.py"), "ENDPOINT"],
        "bare asyncio": [args.python, str(HERE / "skeleton.py"), "--bare", "ENDPOINT"],
    }
    for window in filter(None, args.windows.split(",")):
        shippers[f"zmqpush --coalesce {window}"] = [args.python, args.zmqpush, "-q",
                                                    "--coalesce", window, "-c", "ENDPOINT"]
    if args.batch:
        shippers["zmqpush --batch"] = [args.python, args.zmqpush, "-q", "--batch",
                                       "-c", "ENDPOINT"]
    results = {(load, name): [] for load in loads for name in shippers}
    for _ in range(args.runs):
        for load in loads:
            for name, argv in shippers.items():
                results[load, name].append(measure(argv, *load, args.seconds))

    def med(load, name, key):
        return statistics.median(r[key] for r in results[load, name])

    def ratio(a: float, b: float) -> str:
        return f"{a / b:.2f}" if b else "-"

    print(f"%CPU of one core over a {args.seconds:g} s steady window (after {WARMUP:g} s "
          f"warm-up), median of {args.runs} alternating runs, receiver bench/ccount.c, "
          f"{os.cpu_count()} CPUs, zmqpush {args.zmqpush}\n")
    names = list(shippers)
    print("| lines/s | writes/s | " + " | ".join(f"{n} %CPU" for n in names)
          + " | zmqpush/naive | zmqpush/C | skeleton/naive | bare/naive |")
    print("|---:|---:|" + "---:|" * (len(names) + 4))
    for load in loads:
        rate, per_write = load
        cpu = {n: med(load, n, "cpu") for n in names}
        print(f"| {rate:,} | {rate // per_write:,} | "
              + " | ".join(f"{cpu[n]:.2f}" for n in names)
              + f" | {ratio(cpu['zmqpush'], cpu['naive'])} | {ratio(cpu['zmqpush'], cpu['C'])}"
              + f" | {ratio(cpu['skeleton'], cpu['naive'])}"
              + f" | {ratio(cpu['bare asyncio'], cpu['naive'])} |")
    print("\nContext switches per second (voluntary + involuntary, all threads):\n")
    print("| lines/s | writes/s | " + " | ".join(names) + " |")
    print("|---:|---:|" + "---:|" * len(names))
    for load in loads:
        rate, per_write = load
        print(f"| {rate:,} | {rate // per_write:,} | "
              + " | ".join(f"{med(load, n, 'cs'):,.1f}" for n in names) + " |")
    if args.bursts:
        print("\n%CPU of the main thread alone (reading, encoding, sending; the rest is "
              "libzmq's I/O thread):\n")
        print("| lines/s | writes/s | " + " | ".join(names) + " |")
        print("|---:|---:|" + "---:|" * len(names))
        for rate, per_write in loads:
            print(f"| {rate:,} | {rate // per_write:,} | "
                  + " | ".join(f"{med((rate, per_write), n, 'main'):.2f}" for n in names)
                  + " |")
    short = [(load[0], name, r["received"], r["fed"]) for (load, name), runs in results.items()
             for r in runs if r["received"] != r["fed"]]
    print()
    if short:
        for rate, name, got, fed in short:
            print(f"LOST: {name} at {rate:,} lines/s: received {got:,} of {fed:,}")
    else:
        print(f"Received: every line fed, in all {len(names) * len(loads) * args.runs} "
              "measurements.")
    script = os.path.relpath(__file__)
    print(f"Command: `{shlex.join(['python', script, *sys.argv[1:]])}`")
    if args.chart and not args.bursts:
        draw_chart(args.chart, {n: [med(load, n, "cpu") for load in loads] for n in names})
    return 0


def draw_chart(path: str, cpu: dict):
    """%CPU of each shipper (a line each) against the loads, on a log scale."""
    import matplotlib
    matplotlib.use("Agg")
    from matplotlib import pyplot

    labels = [f"{rate:,} lines/s\n{'one write a line' if per == 1 else f'{per} lines a write'}"
              for rate, per in LOADS]
    fig, ax = pyplot.subplots(figsize=(8, 4.5), dpi=100)
    for name, values in cpu.items():
        ax.plot(labels, values, marker="o", linewidth=2.5 if name == "zmqpush" else 1.2,
                label=name)
    ax.set_yscale("log")
    ax.set_ylabel("%CPU of one core (log scale)")
    ax.set_title("CPU at paced rates (bench/paced.py): lower is better")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)


if __name__ == "__main__":
    sys.exit(main())
