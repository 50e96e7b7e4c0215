"""Issue 12: a second real receiver written in C, rsyslog's imczmq.

A private rsyslogd binds an imczmq PULL socket and writes every message as it
came (%rawmsg%) to a file, so what zmqpush sent is compared byte for byte.
rsyslogd 8.2302 with imczmq may segfault at SIGTERM: its exit status is never
a verdict here."""
import json
import threading
import time

import pytest
from rsyslog import ImczmqRsyslog, imczmq_available

from conftest import free_port, start, stop_process, wait_until

LOGTYPE = "c-receiver"
# rsyslog cuts a message at maxMessageSize (8k by default; seen here: a 100 kB
# message arrives as its first 65536 bytes under 64k): the long line's JSON
# (about 200 kB) must fit whole, so the receivers run with 256k.
MAX_MESSAGE_SIZE = "256k"
LONG_LINE_BYTES = 200_000


@pytest.fixture(autouse=True)
def _imczmq_installed():
    if not imczmq_available():
        pytest.skip("rsyslogd or its imczmq module is missing (Debian: rsyslog-czmq)")


def expected_json(line: bytes, pid: int) -> bytes:
    """What zmqpush must send for line, computed independently of zmqpush."""
    event = {"message": line.decode("utf-8", "replace"), "type": LOGTYPE, "@pid": pid}
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def hostile_lines(count: int) -> list:
    """count lines of the kinds that break naive JSON encoders, none ending in CR
    (zmqpush strips one CR before the newline), one of LONG_LINE_BYTES."""
    controls = bytes(c for c in range(32) if c != 0x0A)
    kinds = [
        b'say "hi" to \\"them\\"',
        b"tab\there\tand\tthere",
        b"controls " + controls + b" end",
        b"caf\xc3\xa9 \xe2\x9c\x93 \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 \xe2\x80\xa8",
        b"invalid \xff\xfe stray \xc0\xaf overlong \xed\xa0\x80 surrogate \xe2\x82 cut",
        b"back\\slash \\n \\u0041 \\\\ C:\\path\\",
        b"",
        b"   spaces kept   ",
        b"</script>{\"json\":[1,2]}\x7f",
    ]
    lines = [kinds[i % len(kinds)] + b" #%d" % i for i in range(count)]
    lines[count // 2] = (b"long line caf\xc3\xa9 " * LONG_LINE_BYTES)[:LONG_LINE_BYTES]
    return lines


def settled(receiver: ImczmqRsyslog, quiet: float = 1.0, timeout: float = 60.0) -> list:
    """The receiver's messages once none arrived for `quiet` seconds (or timeout)."""
    deadline = time.monotonic() + timeout
    last, since = -1, time.monotonic()
    while time.monotonic() < deadline:
        count = len(receiver.received())
        if count != last:
            last, since = count, time.monotonic()
        elif time.monotonic() - since >= quiet:
            break
        time.sleep(0.05)
    return receiver.received()


def test_20k_hostile_lines_arrive_at_imczmq_as_exactly_the_json_sent(tmp_path):
    port = free_port()
    rs = ImczmqRsyslog(tmp_path / "rs", port, tmp_path / "got.txt", MAX_MESSAGE_SIZE)
    lines = hostile_lines(20_000)
    proc = None
    try:
        rs.start()
        proc = start(["-c", f"tcp://127.0.0.1:{port}", "--max-line-bytes", "262144",
                      "--memory-bytes", str(128 << 20), LOGTYPE])
        _, err = proc.communicate(b"\n".join(lines) + b"\n", timeout=120)
        assert proc.returncode == 0, err
        assert wait_until(lambda: len(rs.received()) >= len(lines), 60)
        got = rs.received()
        expected = [expected_json(line, proc.pid) for line in lines]
        assert len(got) == len(expected)
        wrong = [i for i, (g, e) in enumerate(zip(got, expected)) if g != e]
        assert not wrong, (len(wrong), got[wrong[0]][:300], expected[wrong[0]][:300])
        assert len(got[len(lines) // 2]) > LONG_LINE_BYTES
    finally:
        if proc:
            stop_process(proc)
        rs.stop()


def missing_lines(sent: int, lives: list) -> set:
    """Numbers of the lines 0..sent-1 that no receiver life got."""
    return set(range(sent)) - {n for life in lives for n in life}


def line_numbers(messages: list, pid: int) -> list:
    """The line number of each message "r NNNNNN", checking that every message
    is exactly the JSON zmqpush sends for that line (so intact, valid JSON)."""
    numbers = []
    for message in messages:
        number = int(json.loads(message)["message"].split()[1])
        assert message == expected_json(b"r %06d" % number, pid), message[:200]
        numbers.append(number)
    return numbers


def contiguous_runs(numbers: set) -> list:
    """Sorted numbers as (first, last) runs, for the report."""
    runs = []
    for n in sorted(numbers):
        if runs and runs[-1][1] == n - 1:
            runs[-1][1] = n
        else:
            runs.append([n, n])
    return [tuple(r) for r in runs]


def feed(proc, lines: int, chunk: int = 2000, pause: float = 0.02):
    """Write lines "r NNNNNN" to proc's stdin in chunks with a pause between them
    (so the stream outlasts a receiver's shutdown), then close it."""
    for first in range(0, lines, chunk):
        proc.stdin.write(b"".join(b"r %06d\n" % i for i in range(first, first + chunk)))
        proc.stdin.flush()
        time.sleep(pause)
    proc.stdin.close()


def test_imczmq_restarted_mid_stream_gets_every_line_intact(tmp_path):
    """A C receiver restarted mid-stream: the replay window sends again what it
    may have held, so every line arrives, as exactly the JSON sent; the
    duplicates are printed (README "Outages")."""
    sent, restart_after = 200_000, 20_000
    port = free_port()
    lives = [ImczmqRsyslog(tmp_path / f"rs{n}", port, tmp_path / f"got{n}.txt",
                           MAX_MESSAGE_SIZE) for n in (1, 2)]
    proc = None
    try:
        lives[0].start()
        proc = start(["-c", f"tcp://127.0.0.1:{port}", LOGTYPE])
        feeder = threading.Thread(target=feed, args=(proc, sent), daemon=True)
        feeder.start()
        assert wait_until(lambda: len(lives[0].received()) >= restart_after, 60)
        stop_seconds = lives[0].stop()
        lives[1].start()
        feeder.join(120)
        assert not feeder.is_alive(), "zmqpush did not take its input"
        assert proc.wait(60) is not None
        got = [line_numbers(settled(life), proc.pid) for life in lives]
    finally:
        if proc:
            stop_process(proc)
        for life in lives:
            life.stop()
    missing = missing_lines(sent, got)
    duplicates = len(got[0]) + len(got[1]) - (sent - len(missing))
    print(f"\nimczmq restarted after {restart_after} of {sent} lines (stop took "
          f"{stop_seconds:.1f} s, rsyslogd exit status {lives[0].proc.returncode}): "
          f"lost {len(missing)}, duplicates {duplicates}; first life got {len(got[0])}, "
          f"second {len(got[1])}; missing runs {contiguous_runs(missing)[:5]}")
    assert not missing
    assert got[1], "the stream did not go on into the second life"
    assert proc.returncode == 0, proc.stderr.read()
