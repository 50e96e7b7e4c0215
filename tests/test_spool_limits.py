"""The disk spool at its limits: a disk with no room while the receiver is
up, and zmqpush killed again and again soon after it starts.  A real tmpfs
(mounted here, as root), real sockets on 127.0.0.1 and real processes."""
import os
import random
import re
import shutil
import signal
import subprocess
import time
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_spool import FileReceiver, Producer, assert_spool_empty, numbered, position

from conftest import Receiver, free_port, run, start, stop_process, wait_until

KIB, MIB = 1 << 10, 1 << 20
DISK_LINES = 100_000


@contextmanager
def small_tmpfs(where: Path, size: int):
    """A tmpfs of size bytes mounted at where for the block; unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs",
                              str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, leave: int):
    """Fill disk with one file until at most `leave` bytes are free."""
    stats = os.statvfs(disk)
    free = stats.f_bavail * stats.f_frsize
    with open(disk / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))
    stats = os.statvfs(disk)
    assert stats.f_bavail * stats.f_frsize <= leave


def start_on_full_disk(tmp_path: Path, receiver: Receiver, *extra, **kwargs):
    """zmqpush with its spool in tmp_path/disk (see small_tmpfs and fill)."""
    return start(["-q", "-c", receiver.endpoint, "--spool", str(tmp_path / "disk" / "spool"),
                  *extra], **kwargs)


def test_disk_full_with_the_receiver_up_every_line_goes_out_from_memory(tmp_path):
    """Nothing waits for a disk that has no room while a receiver takes the
    lines: they go from memory, counted as not spooled, and all arrive."""
    receiver = Receiver(free_port())
    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        fill(disk, 150 * KIB)
        proc = start_on_full_disk(tmp_path, receiver)
        producer = Producer(proc, numbered(0, DISK_LINES))
        try:
            producer.start()
            code = proc.wait(40)
            err = proc.stderr.read().decode()
            receiver.wait_for(DISK_LINES, 10)  # delivered to the kernel: the thread reads on
        finally:
            stop_process(proc)
            receiver.stop()
    assert producer.closed.is_set()
    assert "cannot write (No space left on device)" in err, err
    assert receiver.messages() == [f"{i:08d}" for i in range(DISK_LINES)], (
        f"{len(receiver.frames)} of {DISK_LINES} arrived; {err}")
    assert code == 0, err
    assert re.search(r"\. Kept (\d+) messages in memory only \(the spool could not take "
                     r"them\)", err), err


def test_disk_full_sigterm_loses_nothing_read(tmp_path):
    """A SIGTERM while the disk has no room: every line read still goes out."""
    receiver = Receiver(free_port())
    source = tmp_path / "input"
    source.write_bytes(numbered(0, DISK_LINES))
    with small_tmpfs(tmp_path / "disk", 2 * MIB) as disk:
        fill(disk, 150 * KIB)
        with open(source, "rb") as stdin:
            proc = start_on_full_disk(tmp_path, receiver, "--linger", "10", stdin=stdin)
            try:
                receiver.wait_for(1, 10)
                os.kill(proc.pid, signal.SIGTERM)
                code = proc.wait(30)
                err = proc.stderr.read().decode()
            finally:
                stop_process(proc)
            read = os.lseek(stdin.fileno(), 0, os.SEEK_CUR)
        receiver.settle(0.5)
        receiver.stop()
    assert "could not be written to the spool" not in err, err
    whole, part = divmod(read, 9)
    expected = [f"{i:08d}" for i in range(whole)] + ([f"{whole:08d}"[:part]] if part else [])
    got = receiver.messages()
    assert got[:len(expected)] == expected and len(got) == len(expected), (
        f"read {len(expected)} lines, {len(got)} arrived; {err}")
    assert code in (0, 3), err


# -- zmqpush killed again and again soon after it starts, default settings

LOOP_LINES = 750_000  # 54 MB spooled: more than a run sends (and than a receiver's host holds)
LOOP_LINE = b"%08d-abcdefghij\n"
LOOP_SECONDS = 30
# A run is killed once the receiver got this many of its frames (62 bytes each
# written by FileReceiver): past what a receiver's host may hold (about 7 MiB of
# spool, some 110,000 lines here), short of sending the whole spool.  (Counted in
# time from the run's first frame instead, a loaded machine's slow runs sent too
# little to make progress; from the start, its slow start-ups sent nothing.)
LOOP_FRAMES = (220_000, 340_000)
FRAME_BYTES = len(b'{"message":"00000000-abcdefghij","type":"syslog","@pid":1234}\n')


class NewLines:
    """The distinct lines a FileReceiver has written so far, read as its file grows."""

    def __init__(self, path: Path):
        self.path, self.lines, self._at = path, set(), 0

    def update(self) -> int:
        """Read what arrived since the last call (whole frames); the count so far."""
        if self.path.exists():
            with open(self.path, "rb") as f:
                f.seek(self._at)
                data = f.read()
            whole = data.rfind(b"\n") + 1
            self._at += whole
            for frame in data[:whole].splitlines():
                self.lines.add(frame.split(b'"', 4)[3])  # {"message":"…",
        return len(self.lines)


def settled(receiver: FileReceiver, quiet: float = 0.3):
    """Wait until the receiver's file stopped growing for `quiet` seconds."""
    last, since = -1, time.monotonic()
    while time.monotonic() - since < quiet:
        size = receiver.size()
        if size != last:
            last, since = size, time.monotonic()
        time.sleep(0.02)


def test_a_crash_loop_at_default_settings_makes_progress_and_everything_arrives(tmp_path):
    """The spool holds more than one short run sends (a short run never sends
    the 64 MiB window either); zmqpush is SIGKILLed early in each run, once the
    receiver got a random number of its frames (not alone: no run is timed).
    The distinct lines delivered grow with nearly every run (the position
    moves with what the receiver can no longer lose, not with the window,
    and is written soon enough for a short run), and a last run sends the
    rest."""
    spool = tmp_path / "spool"
    data = b"".join(LOOP_LINE % i for i in range(LOOP_LINES))
    filled = run([*spool_args(spool, f"tcp://127.0.0.1:{free_port()}"), "--linger", "0"],
                 data, timeout=120)
    assert filled.returncode == 3, filled.stderr  # the receiver was down: all stays spooled
    receiver = FileReceiver(tmp_path / "got")
    seen = NewLines(tmp_path / "got")
    rng = random.Random(20250124)
    counts, positions = [], []
    proc = None
    try:
        deadline = time.monotonic() + LOOP_SECONDS
        while time.monotonic() < deadline and (not counts or counts[-1] < LOOP_LINES):
            before = receiver.size()
            proc = start(spool_args(spool, receiver.endpoint), stdin=subprocess.DEVNULL,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            enough = before + rng.randint(*LOOP_FRAMES) * FRAME_BYTES
            assert wait_until(lambda p=proc, e=enough: receiver.size() >= e or p.poll() is not None,
                              30, 0.01), "too little sent"
            proc.send_signal(signal.SIGKILL)  # unless it sent the rest and ended
            proc.wait(10)
            settled(receiver)
            counts.append(seen.update())
            positions.append(position(spool))
        proc = start(["--linger", "60", *spool_args(spool, receiver.endpoint)],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
        code = proc.wait(120)
        err = proc.stderr.read().decode()
        receiver.finish(quiet=0.5)  # exit 0: the receiver's host took everything
    finally:
        if proc is not None:
            stop_process(proc)
        receiver.stop()
    print(f"\n{len(counts)} kills; distinct lines after each: {counts}; positions {positions}")
    pairs = [(earlier, later) for earlier, later in zip(counts, counts[1:])
             if earlier < LOOP_LINES]
    # How many runs it takes depends on the machine's speed; each must make progress.
    assert all(later > earlier for earlier, later in pairs), counts
    assert code == 0, err
    assert seen.update() == LOOP_LINES
    assert_spool_empty(spool)


def spool_args(spool: Path, endpoint: str) -> list:
    """zmqpush's arguments at default settings, but -q, with a spool."""
    return ["-q", "-c", endpoint, "--spool", str(spool)]
