"""Issue 25: coalesced reads.  While lines keep coming, stdin is read at most once
per --coalesce window; a line after a quiet spell is read at once.

A window of 0.5 s (half the largest) makes each behaviour plain against scheduling
noise in a test run alone: what waits for a window waits most of it, what does not
arrives long before.
"""
import signal
import time

import pytest
from test_shipping import wakeups_once_settled

from conftest import closing_count, start, stop_process

# The tests that measure when lines arrive run alone (tests/README.md).
WINDOW = 0.5


def settled_after_a_line(proc, receiver):
    """Write a line and wait for it, then a quiet spell longer than the window: the
    next line comes after a quiet spell, however long start-up took."""
    proc.stdin.write(b"started\n")
    proc.stdin.flush()
    assert receiver.wait_for(1, 10) == 1
    time.sleep(1.2 * WINDOW)


def arrival_after(receiver, count: int, since: float, timeout: float = 10) -> float:
    """Seconds from since until the receiver holds count frames."""
    assert receiver.wait_for(count, timeout) == count, receiver.frames
    return time.monotonic() - since


@pytest.mark.alone
def test_a_line_after_a_quiet_spell_is_read_at_once_and_the_next_waits_out_the_window(
        receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", str(WINDOW)])
    try:
        settled_after_a_line(proc, receiver)
        began = time.monotonic()
        proc.stdin.write(b"after a quiet spell\n")
        proc.stdin.flush()
        assert arrival_after(receiver, 2, began) < WINDOW / 2
        began = time.monotonic()
        proc.stdin.write(b"within the window\n")
        proc.stdin.flush()
        assert arrival_after(receiver, 3, began) > WINDOW / 4
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert receiver.messages() == ["started", "after a quiet spell", "within the window"]


@pytest.mark.alone
def test_window_0_reads_every_line_at_once(receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", "0"])
    try:
        proc.stdin.write(b"line 0\n")  # once it arrived, start-up is over
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        for n in range(1, 4):
            began = time.monotonic()
            proc.stdin.write(b"line %d\n" % n)
            proc.stdin.flush()
            assert arrival_after(receiver, n + 1, began) < WINDOW / 2
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_lines_written_within_windows_arrive_complete_and_in_order(receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", "0.02"])
    lines = [b"line %d of a paced stream" % n for n in range(2000)]
    try:
        for n, line in enumerate(lines):
            proc.stdin.write(line + b"\n")
            proc.stdin.flush()
            if n % 20 == 0:
                time.sleep(0.002)
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert closing_count(proc.stderr.read()) == len(lines)
    finally:
        stop_process(proc)
    assert receiver.wait_for(len(lines)) == len(lines)
    assert receiver.messages() == [line.decode() for line in lines]


@pytest.mark.alone
def test_confirm_replies_to_each_line_with_no_window(receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--confirm", "--coalesce", str(WINDOW)])
    try:
        assert proc.stdout.readline() == b"OK\n"
        for n in range(5):
            began = time.monotonic()
            proc.stdin.write(b"confirmed %d\n" % n)
            proc.stdin.flush()
            assert proc.stdout.readline() == b"OK\n"
            assert time.monotonic() - began < WINDOW / 2
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert receiver.wait_for(5) == 5


@pytest.mark.alone
def test_end_of_input_within_a_window_ends_it_and_loses_nothing(receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", str(WINDOW)])
    try:
        proc.stdin.write(b"first\n")  # read at once or at the end of start-up's window
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        first_arrived = time.monotonic()
        proc.stdin.write(b"second\nthird\n")
        proc.stdin.flush()
        time.sleep(0.1)  # the edge of these lines starts a window
        proc.stdin.close()
        # before the window after the first read would have ended
        assert arrival_after(receiver, 3, first_arrived) < 0.8 * WINDOW
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert receiver.wait_for(3) == 3
    assert receiver.messages() == ["first", "second", "third"]


@pytest.mark.alone
def test_sigterm_within_a_window_ends_it_and_reads_all_that_came_in_it(receiver):
    """More than one read takes (48 KiB, where a read after short ones asks for 32)."""
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", str(WINDOW)])
    lines = [b"in the window %05d " % n + b"x" * 80 for n in range(500)]
    try:
        proc.stdin.write(b"first\n")  # read at once or at the end of start-up's window
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        first_arrived = time.monotonic()
        proc.stdin.write(b"".join(line + b"\n" for line in lines))
        proc.stdin.flush()
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        # before the window after the first read would have ended
        assert arrival_after(receiver, 1 + len(lines), first_arrived) < 0.8 * WINDOW
        assert proc.wait(10) == 0
        assert closing_count(proc.stderr.read()) == 1 + len(lines)
    finally:
        stop_process(proc)
    assert receiver.wait_for(1 + len(lines)) == 1 + len(lines)
    assert receiver.messages()[1:] == [line.decode() for line in lines]


def test_after_a_burst_of_coalesced_lines_an_idle_run_never_wakes(receiver):
    proc = start(["-q", "-c", receiver.endpoint, "--coalesce", "0.05"])
    try:
        for n in range(200):
            proc.stdin.write(b"burst %d\n" % n)
            proc.stdin.flush()
            time.sleep(0.002)
        assert receiver.wait_for(200, 10) == 200
        assert wakeups_once_settled(proc) == 0  # after the last window and quiet checks
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
