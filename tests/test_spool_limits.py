"""The disk spool at its limits: a disk with no room while the receiver is
up, and zmqpush killed again and again soon after it starts.  A real tmpfs
(mounted here, as root), real sockets on 127.0.0.1 and real processes."""
import os
import re
import shutil
import signal
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest
from test_spool import Producer, numbered

from conftest import Receiver, free_port, start, stop_process

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
