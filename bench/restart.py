#!/usr/bin/env python3
"""Outages: what a receiver restart costs, for each mode, in one run.

A receiver set up like logstash-input-zeromq (bench/stock_input.py: LINGER 1,
RCVHWM 1000, consuming at most --rate events/s) is stopped (SIGTERM, or SIGKILL
with --kill) and started again on the same port --restarts times while zmqpush
ships --lines numbered lines of 20 to 180 bytes from a pipe.  The table shows,
per mode, the lines that never arrived, the duplicates, zmqpush's exit code and
its replay counters.  Every loop is bounded in time.
"""
import argparse
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

from ports import free_port
from stock_input import parsed_together

HERE = Path(__file__).resolve().parent
ZMQPUSH = str(HERE.parent / "zmqpush.py")
RECEIVER = str(HERE / "stock_input.py")

MODES = {
    "default, replay off": ["--replay-bytes", "0"],
    "default": [],
    "--batch, replay off": ["--batch", "--replay-bytes", "0"],
    "--batch": ["--batch"],
    # The spool's window is on disk (64 MiB): it covers a receiver host whose
    # tcp_rmem maximum was raised (32 MiB here); --linger counts from end of
    # input, which comes at once with a spool, so it is raised.
    "default, spool": ["--spool", "{tmp}/spool-default", "--linger", "60"],
    "--batch, spool": ["--batch", "--spool", "{tmp}/spool-batch", "--linger", "60"],
}


@functools.lru_cache(maxsize=2)
def numbered_lines(count: int) -> bytes:
    """count lines "N xxx…" of 20 to 180 bytes, N from 0."""
    return b"".join(b"%d " % i + b"x" * (18 + (i * 37) % 160) + b"\n" for i in range(count))



def id_record(line: str) -> list:
    """[id, message] of a line the receiver wrote with --ids.  A receiver killed
    in the middle of a large write leaves a torn record, and the next one
    appends to it: the whole record after it is the line's."""
    try:
        return json.loads(line)
    except ValueError:
        return json.loads(line[line.rindex('["', 1):])


def id_records(lines: list) -> list:
    """id_record of each line, the whole lines (one '["' each) parsed together."""
    whole = [at for at, line in enumerate(lines) if line.count('["') == 1]
    parsed = parsed_together([lines[at] for at in whole])
    if not all(isinstance(r, list) and len(r) == 2 for r in parsed):
        parsed = []  # a torn record took one '["' away: each on its own
    records = dict(zip(whole, parsed))
    return [records[at] if at in records else id_record(line) for at, line in enumerate(lines)]


class Outage:
    """One shipment with receiver restarts; run() returns its figures."""

    def __init__(self, args_: list, *, lines: int, restarts: int, rate: float, kill: bool,
                 tmp: str, bind: bool = False, rcvbuf: int = 0, share: float = 1.0):
        self.args = [arg.format(tmp=tmp) for arg in args_]  # "{tmp}": a directory for this run
        self.lines, self.restarts, self.rate, self.kill = lines, restarts, rate, kill
        self.rcvbuf = rcvbuf  # the receiver's SO_RCVBUF (bench/stock_input.py --rcvbuf)
        self.out = os.path.join(tmp, f"received-{time.monotonic_ns()}.txt")
        self.endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.bind = bind
        self.share = share  # of the lines this receiver gets: others may be connected too
        self.ids = "--event-id" in args_
        self.stderr = ""
        self._counted, self._counted_bytes = 0, 0  # received_count's progress in out
        self._received = None  # received(), once read

    def receiver(self) -> subprocess.Popen:
        where = ["--connect" if self.bind else "--bind", self.endpoint]
        ids = ["--ids"] if self.ids else []
        rcvbuf = ["--rcvbuf", str(self.rcvbuf)] if self.rcvbuf else []
        return subprocess.Popen([sys.executable, RECEIVER, *where, "--rate", str(self.rate),
                                 "--out", self.out, *ids, *rcvbuf], stdout=subprocess.DEVNULL)

    def received_count(self) -> int:
        """The events the receivers wrote so far: only what was appended since the
        last call is read (the file grows to 30 MB, read every 20 ms)."""
        try:
            with open(self.out, "rb") as f:
                f.seek(self._counted_bytes)
                more = f.read()
        except FileNotFoundError:
            return 0
        self._counted_bytes += len(more)
        self._counted += more.count(b"\n")
        return self._counted

    def run(self) -> dict:
        receiver = self.receiver()
        where = ["--bind" if self.bind else "-c", self.endpoint]
        shipper = subprocess.Popen([sys.executable, ZMQPUSH, "-q", *where, "--linger", "10",
                                    *self.args],
                                   stdin=subprocess.PIPE, stderr=subprocess.PIPE)
        feeder = threading.Thread(target=self._feed, args=(shipper,), daemon=True)
        feeder.start()
        try:
            for n in range(1, self.restarts + 1):
                restart_at = self.lines * n // (self.restarts + 2)
                self._wait_received(int(restart_at * self.share), 60, shipper)
                receiver.send_signal(signal.SIGKILL if self.kill else signal.SIGTERM)
                receiver.wait(10)
                time.sleep(0.3)
                receiver = self.receiver()
            feeder.join(120)
            code = shipper.wait(60)
            self._wait_quiet(1.0, 60)
        finally:
            for proc in (shipper, receiver):
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(10)
        self.stderr = shipper.stderr.read().decode()
        return self._figures(code)

    def _feed(self, shipper):
        try:
            shipper.stdin.write(numbered_lines(self.lines))
            shipper.stdin.close()
        except BrokenPipeError:
            pass

    def _wait_received(self, count: int, timeout: float, shipper):
        """Until the receiver wrote count events, or zmqpush exited (all handed
        over: a restart now shows what the receiver held), or timeout."""
        deadline = time.monotonic() + timeout
        while self.received_count() < count and time.monotonic() < deadline \
                and shipper.poll() is None:
            time.sleep(0.02)

    def _wait_quiet(self, quiet: float, timeout: float):
        deadline, last, since = time.monotonic() + timeout, -1, time.monotonic()
        while time.monotonic() < deadline:
            n = self.received_count()
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet:
                return
            time.sleep(0.05)

    def received(self) -> list:
        """(event id or None, line number) per event received, in order (read
        once, after run())."""
        if self._received is None:
            with open(self.out, encoding="utf-8") as f:
                lines = f.read().splitlines()
            rows = id_records(lines) if self.ids else [[None, line] for line in lines]
            self._received = [(event_id, int(message.split(" ", 1)[0]))
                              for event_id, message in rows]
        return self._received

    def counters(self) -> dict:
        """Replayed messages and disconnects from zmqpush's closing line."""
        found = re.search(r"Replayed (\d+) messages after (\d+) receiver disconnects",
                          self.stderr)
        return {"replayed": int(found[1]), "disconnects": int(found[2])} if found else \
            {"replayed": 0, "disconnects": 0}

    def _figures(self, code: int) -> dict:
        seen = Counter(number for _, number in self.received())
        values = self.counters()
        return {"lost": sum(1 for i in range(self.lines) if i not in seen),
                "duplicates": sum(seen.values()) - len(seen), "exit": code,
                "disconnects": values.get("disconnects", "?"),
                "replayed": values.get("replayed", "?")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lines", type=int, default=300_000)
    p.add_argument("--restarts", type=int, default=3)
    p.add_argument("--rate", type=float, default=60_000, help="receiver events/s")
    p.add_argument("--kill", action="store_true", help="SIGKILL the receiver, not SIGTERM")
    p.add_argument("--bind", action="store_true", help="zmqpush binds, the receiver connects")
    args = p.parse_args()
    how = "SIGKILL" if args.kill else "SIGTERM"
    print(f"{args.lines:,} lines, receiver ({how}) restarted {args.restarts} times, "
          f"consuming at most {args.rate:,.0f} events/s{', zmqpush --bind' if args.bind else ''}\n")
    print("| mode | lost | duplicates | exit | disconnects | replayed events |")
    print("|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for mode, extra in MODES.items():
            r = Outage(extra, lines=args.lines, restarts=args.restarts, rate=args.rate,
                       kill=args.kill, tmp=tmp, bind=args.bind).run()
            print(f"| {mode} | {r['lost']:,} | {r['duplicates']:,} | {r['exit']} "
                  f"| {r['disconnects']} | {r['replayed']} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
