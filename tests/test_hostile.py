"""Issue 10: what a hostile user can pass in never hangs, crashes or loses lines silently."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import cli, env_with, run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zmqpush

SIGIGN_USR1_HUP = (1 << (signal.SIGUSR1 - 1)) | (1 << (signal.SIGHUP - 1))


def ignored_signals(pid: int) -> int:
    """The SigIgn mask of a running process (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("SigIgn:"):
                    return int(line.split()[1], 16)
    except FileNotFoundError:
        pass
    return 0


def one_usage_line(proc) -> str:
    """The single stderr line of a usage error (exit 2, no traceback)."""
    lines = proc.stderr.decode(errors="replace").splitlines()
    assert proc.returncode == 2, (proc.returncode, lines)
    assert len(lines) == 1 and lines[0].startswith("zmqpush: "), lines
    return lines[0]


# -- 7. early signals ------------------------------------------------------------

def test_sighup_and_sigusr1_during_start_up_do_not_kill_it():
    """From the moment the script runs (it ignores both before its slow imports)
    until the end, HUP and USR1 (what rsyslog forwards) never kill it."""
    proc = subprocess.Popen(cli("-c", "tcp://127.0.0.1:9", "--linger", "0"),
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_with(None))
    try:
        deadline = time.monotonic() + 10
        while ignored_signals(proc.pid) & SIGIGN_USR1_HUP != SIGIGN_USR1_HUP:
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.0005)
        began = time.monotonic()
        sent = 0
        while time.monotonic() - began < 0.3:  # start-up, imports and the run itself
            os.kill(proc.pid, signal.SIGUSR1)
            os.kill(proc.pid, signal.SIGHUP)
            sent += 1
            time.sleep(0.002)
        assert proc.poll() is None, "killed by an early signal"
        proc.stdin.close()
        assert proc.wait(10) == 0
        assert sent > 10
    finally:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait(10)


# -- 4. option values ------------------------------------------------------------

@pytest.mark.parametrize("args", [
    ["--sndhwm", "3000000000"], ["--heartbeat", "1000000"], ["--heartbeat", "0.001"],
    ["--linger", "3000000"], ["--linger", "inf"], ["--stats", "1e9"],
    ["--confirm-timeout", "100000"], ["--confirm-timeout", "nan"],
    ["--batch", "--batch-bytes", "1000000000000"], ["--batch", "--batch-bytes", "1e23"],
    ["--max-line-bytes", "3"], ["--max-line-bytes", "0"],
    ["-c", "inproc://zmqpush"], ["--bind", "inproc://zmqpush"],
    ["--confirm", "--when-full", "drop"],
], ids=" ".join)
def test_out_of_range_values_are_one_line_usage_errors(args):
    one_usage_line(run(args, b"never read\n", timeout=20))


@pytest.mark.parametrize("args", [
    [b"\xff"], [b"-f", b"key=\xff"], [b"-f", b"\xfe=value"], [b"-c", b"tcp://h\xff:2120"],
    [b"--bind", b"ipc:///tmp/\xff"],
], ids=["logtype", "field value", "field key", "connect", "bind"])
def test_arguments_that_are_not_utf8_are_usage_errors(args):
    """Without the fix, LOGTYPE made the encoder fail and the run hang."""
    argv = [os.fsdecode(a) for a in args]
    line = one_usage_line(run(argv, b"hi\n", timeout=20))
    assert "not valid UTF-8" in line


@pytest.mark.parametrize("name", ["ZMQPUSH_LOGTYPE", "ZMQPUSH_FIELD", "ZMQPUSH_CONNECT",
                                  "ZMQPUSH_LINGER"])
def test_environment_values_that_are_not_utf8_are_usage_errors(name):
    env = env_with(None)
    env_bytes = {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    env_bytes[name.encode()] = b"k=\xff" if name == "ZMQPUSH_FIELD" else b"x\xff"
    proc = subprocess.run(cli(), input=b"hi\n", env=env_bytes, capture_output=True,
                          timeout=20)
    assert name in one_usage_line(proc)


# -- 6. --max-line-bytes -----------------------------------------------------------

def framed_messages(chunks: list, limit: int) -> list:
    """(message bytes, continues) for each message the framer makes of chunks,
    as the encoder will send it (one CR before a newline stripped where asked)."""
    framer = zmqpush.LineFramer(limit)
    segments = [s for chunk in chunks for s in framer.feed(chunk)] + framer.finish()
    out = []
    for seg in segments:
        lines = seg.lines.replace(b"\r\n", b"\n") if seg.strip_cr else seg.lines
        out += [(line, seg.continues) for line in lines.split(b"\n")[:-1]]
    return out


def expected_lines(data: bytes) -> list:
    """The lines of data as zmqpush defines them: one CR before a newline is not
    part of a line; a last line without newline is kept as it is."""
    *complete, last = data.split(b"\n")
    lines = [line[:-1] if line.endswith(b"\r") else line for line in complete]
    return [*lines, last] if last else lines


def joined(messages: list) -> list:
    """Lines rebuilt by concatenating pieces until one lacks "@continues"."""
    lines, current = [], b""
    for message, continues in messages:
        current += message
        if not continues:
            lines.append(current)
            current = b""
    assert current == b"", "the last piece is marked as continued"
    return lines


def chunked(data: bytes, cuts: list) -> list:
    """data cut at the given offsets (as reads of any size would give it)."""
    bounds = sorted({0, len(data), *(c % (len(data) + 1) for c in cuts)})
    return [data[a:b] for a, b in zip(bounds, bounds[1:])]


TEXT = st.text(alphabet=st.sampled_from("ab\r\n\t é€😀\u0800\U00010000"), max_size=80)


@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=120).map(lambda b: b.replace(b"\x00", b"\n")),
       st.lists(st.integers(0, 200), max_size=6), st.integers(4, 12))
def test_framer_pieces_never_exceed_the_limit_and_join_back_to_the_bytes(data, cuts, limit):
    messages = framed_messages(chunked(data, cuts), limit)
    assert all(len(message) <= limit for message, _ in messages)
    assert joined(messages) == expected_lines(data)


@settings(max_examples=500, deadline=None)
@given(TEXT, st.lists(st.integers(0, 400), max_size=6), st.integers(4, 12))
def test_framer_pieces_of_utf8_each_decode_and_join_to_the_same_text(text, cuts, limit):
    data = text.encode("utf-8")
    messages = framed_messages(chunked(data, cuts), limit)
    assert all(len(message) <= limit for message, _ in messages)
    decoded = [(message.decode("utf-8"), continues) for message, continues in messages]
    rebuilt, current = [], ""
    for piece, continues in decoded:
        current += piece
        if not continues:
            rebuilt.append(current)
            current = ""
    assert rebuilt == [line.decode("utf-8") for line in expected_lines(data)]


def test_a_line_one_byte_over_the_limit_is_split(receiver):
    proc = run(["-c", receiver.endpoint, "--max-line-bytes", "4"], b"abcde\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(2, 10) == 2
    events = receiver.events()
    assert [e["message"] for e in events] == ["abcd", "e"]
    assert events[0]["@continues"] is True and "@continues" not in events[1]


def test_the_smallest_limit_keeps_every_character(receiver):
    """4 bytes hold any one UTF-8 character: pieces are cut between characters."""
    proc = run(["-c", receiver.endpoint, "--max-line-bytes", "4"], "€€😀a\r\n".encode())
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(4, 10) == 4
    assert receiver.messages() == ["€", "€", "😀", "a"]
