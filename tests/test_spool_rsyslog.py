"""zmqpush --confirm --spool as rsyslog's omprog program, SIGKILLed again and
again while lines flow: every line rsyslog was told "OK" for is in the spool
(the next instance sends it first), every other one rsyslog sends again.

The configuration is README's confirm mode (test_rsyslog.confirm_rules): the
ruleset's queue has one worker, so omprog runs one zmqpush at a time on the
spool directory.  Not forceSingleInstance: with it, Debian's rsyslogd 8.2302
segfaults when a confirmMessages program dies before its first "OK" (seen
with /bin/false too), and this test kills zmqpush there."""
from __future__ import annotations

import collections
import json
import os
import random
import signal
import threading
import time

import pytest
from rsyslog import PrivateRsyslog, available, pid_alive
from test_rsyslog import binary, confirm_rules, wait_gone

from conftest import ZMQPUSH, Receiver, free_port, run, start, stop_process


@pytest.fixture(autouse=True)
def _rsyslogd_installed():
    assert available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"


def zmqpush_child(rs: PrivateRsyslog) -> int | None:
    """The live zmqpush that rsyslogd runs (a child of it whose command line
    is zmqpush.py), or None."""
    for pid in rs.children():
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if ZMQPUSH.encode() in args and pid_alive(pid):
            return pid
    return None


def wait_child(rs: PrivateRsyslog, timeout: float) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = zmqpush_child(rs)
        if pid is not None:
            return pid
        time.sleep(0.02)
    return None


class Delivered:
    """The distinct messages a Receiver got so far (frames parsed once each)."""

    def __init__(self, receiver: Receiver):
        self._receiver = receiver
        self._parsed = 0
        self.messages = set()

    def count(self) -> int:
        frames = self._receiver.frames
        n = len(frames)
        self.messages.update(json.loads(f)["message"] for f in frames[self._parsed:n])
        self._parsed = n
        return len(self.messages)


class PacedSender(threading.Thread):
    """Sends messages into rsyslog's TCP input in chunks, spread over about
    `seconds` (rsyslog's queue takes them while zmqpush is down)."""

    def __init__(self, rs: PrivateRsyslog, messages: list, seconds: float, chunk: int = 250):
        super().__init__(daemon=True)
        self._rs, self._messages, self._chunk = rs, messages, chunk
        self._pause = seconds / max(1, len(messages) // chunk)
        self.error = None

    def run(self):
        try:
            for i in range(0, len(self._messages), self._chunk):
                self._rs.send(self._messages[i:i + self._chunk])
                time.sleep(self._pause)
        except Exception as exc:  # reported by the test
            self.error = exc


def wait_child_unless_done(rs: PrivateRsyslog, delivered: Delivered, lines: int,
                           timeout: float, instances: set) -> int | None:
    """The zmqpush rsyslogd runs, once there is one (added to instances); None
    if all lines were delivered first (omprog starts no instance without lines
    to send) or timeout passed."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and delivered.count() < lines:
        pid = zmqpush_child(rs)
        if pid is not None:
            instances.add(pid)
            return pid
        time.sleep(0.02)
    return None


def wait_shipping(rs: PrivateRsyslog, pid: int, delivered: Delivered, lines: int):
    """Wait (at most 15 s) until more lines arrived than when zmqpush pid was seen,
    all did, or pid is no longer rsyslogd's zmqpush."""
    before = delivered.count()
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and zmqpush_child(rs) == pid:
        if delivered.count() > before or before == lines:
            return
        time.sleep(0.01)


def test_confirm_spool_zmqpush_sigkilled_again_and_again_mid_flow_every_line_arrives(tmp_path):
    """Up to 6 kills while lines remain to be delivered (2 before the first "OK",
    4 after shipping: each restart waits out omprog's retry interval, 1 s, so
    more kills cost time, not cases): how many happen before all have arrived
    depends on the machine's speed (with 12 tried, 9 to 12 seen), so what is
    asserted is what must hold for any count: no line lost, kills in mid-flow
    (the first two before the instance's first "OK"), killed instances that
    had shipped, and no line more often than there were instances (each
    sends a spooled record once; a frame's @pid is the instance that read
    the line, so copies from later instances carry it too)."""
    lines, kills, flow_seconds = 10_000, 6, 6.0
    seed = random.randrange(1 << 32)
    rng = random.Random(seed)
    receiver = Receiver(free_port())
    spool = tmp_path / "spool"
    rs = PrivateRsyslog(tmp_path, rules=confirm_rules(
        binary("app", "--confirm", "--spool", str(spool), "-c", receiver.endpoint), tmp_path))
    messages = [f"crash-loop {i:05d}" for i in range(lines)]
    began = time.monotonic()
    end = began + 100  # the whole test takes about 15 s
    killed = []  # (pid, distinct lines delivered when it was killed)
    instances = set()  # every zmqpush seen running
    delivered = Delivered(receiver)
    try:
        rs.start()
        sender = PacedSender(rs, messages, flow_seconds)
        sender.start()
        for _ in range(kills + 5):  # an instance that ended by itself is not counted
            if len(killed) == kills:
                break
            pid = wait_child_unless_done(rs, delivered, lines, min(15, end - time.monotonic()),
                                         instances)
            if pid is None and delivered.count() == lines:
                break
            assert pid is not None, (f"omprog did not (re)start zmqpush (seed {seed}, "
                                     f"kills {killed}, children {rs.children()}, "
                                     f"sender {sender.is_alive()} {sender.error!r})")
            # A random moment of this instance's life; the first two before it
            # can have said its first "OK" (Python alone takes longer to start), the
            # others once it shipped (a loaded machine's start-up can take longer
            # than the 0.9 s a kill may wait).
            if len(killed) < 2:
                time.sleep(rng.uniform(0, 0.03))
            else:
                wait_shipping(rs, pid, delivered, lines)
                time.sleep(rng.uniform(0.03, 0.9))
            if zmqpush_child(rs) == pid:
                os.kill(pid, signal.SIGKILL)
                killed.append((pid, delivered.count()))
                assert wait_gone(pid, 5)
        sender.join(max(0, end - time.monotonic()))
        assert not sender.is_alive() and sender.error is None, sender.error
        while time.monotonic() < end and delivered.count() < lines:
            wait_child_unless_done(rs, delivered, lines, 0.2, instances)
            time.sleep(0.02)
        receiver.settle(1)
        events = receiver.events()  # every frame strict JSON
        got = collections.Counter(e["message"] for e in events)
        lost = sorted(set(messages) - set(got))
        assert not lost, f"lost {len(lost)}, e.g. {lost[:5]} (seed {seed}, kills {killed})"
        assert set(got) == set(messages)
        assert {e["type"] for e in events} == {"app"}
        mid_flow = [n for _, n in killed if 0 < n < lines]
        assert len(mid_flow) >= 3, f"kills not mid-flow (seed {seed}): {killed}"
        shipped = {e["@pid"] for e in events} & {pid for pid, _ in killed}
        assert len(shipped) >= 2, f"killed before shipping anything: {killed}"
        # A line rsyslog sent to an instance killed before its reply is sent again
        # to the next, which spools it as a record of its own: each instance may
        # send the copies it holds, so the bound is instances times copies.
        most = max(got.values())
        assert most <= 2 * len(instances), f"a line came {most} times from {len(instances)} runs"
        last = zmqpush_child(rs)
        rs.stop()
        assert last is None or wait_gone(last, 10)
        err = (tmp_path / "zmqpush.err").read_text(errors="replace")
        assert "in use by another zmqpush" not in err and "Traceback" not in err, err[-2000:]
        if last is not None:  # a killed last instance leaves its delivered records behind
            assert sorted(os.listdir(spool)) == ["lock", "position"], err[-2000:]
        duplicates = sum(n - 1 for n in got.values())
        print(f"seed {seed}: {len(killed)} kills ({len(shipped)} after shipping), "
              f"{len(instances)} instances, {duplicates} duplicates (at most {most} copies), "
              f"{time.monotonic() - began:.1f} s")
    finally:
        rs.stop()
        receiver.stop()


def test_a_one_shot_run_drains_what_an_rsyslog_run_left_in_the_spool(tmp_path, receiver):
    """README "Confirm mode": lines a run left in --spool wait for the next
    message that makes rsyslog start zmqpush; `zmqpush.py --spool DIR </dev/null`
    sends them at once, and while rsyslog's zmqpush holds DIR it exits 2."""
    spool, dead = str(tmp_path / "spool"), f"tcp://127.0.0.1:{free_port()}"
    lines = [f"left {n}" for n in range(50)]
    first = run(["--confirm", "--spool", spool, "-c", dead, "--linger", "0.5"],
                "".join(f"{line}\n" for line in lines).encode())
    assert first.returncode == 3 and b"stay in the spool" in first.stderr, first.stderr
    holder = start(["--confirm", "--spool", spool, "-c", dead])  # as rsyslog starts it
    try:
        assert holder.stdout.readline() == b"OK\n"
        with open(os.devnull, "rb") as nothing:
            held = run(["--spool", spool, "-c", receiver.endpoint], stdin=nothing)
        assert held.returncode == 2 and b"is in use by another zmqpush" in held.stderr
    finally:
        holder.stdin.close()
        holder.wait(30)
        stop_process(holder)
    with open(os.devnull, "rb") as nothing:
        drained = run(["--spool", spool, "-c", receiver.endpoint], stdin=nothing)
    assert drained.returncode == 0, drained.stderr
    receiver.settle(0.3)
    assert set(receiver.messages()) == set(lines)
    assert b"Spooled: 0 bytes left" in drained.stderr, drained.stderr
