"""Issue 10: what a hostile user can pass in never hangs, crashes or loses lines silently."""
import json
import os
import pty
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import (
    CHECKOUT_ZMQPUSH,
    WATERMARK,
    ZMQPUSH,
    cli,
    closing_count,
    env_with,
    python_script,
    run,
    start,
    stop_process,
    unstamped,
    wait_stop_signals_taken,
)

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
    lines = unstamped(proc.stderr).decode(errors="replace").splitlines()
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
    as the encoder will send it (one CR before a newline stripped where asked,
    invalid UTF-8 repaired)."""
    framer = zmqpush.LineFramer(limit)
    segments = [s for chunk in chunks for s in framer.feed(chunk)] + framer.finish()
    out = []
    for seg in segments:
        lines = seg.lines.replace(b"\r\n", b"\n") if seg.strip_cr else seg.lines
        out += [(line, seg.continues) for line in zmqpush.valid_utf8(lines).split(b"\n")[:-1]]
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
    """Counted after repair: an invalid byte becomes the 3 bytes of U+FFFD."""
    messages = framed_messages(chunked(data, cuts), limit)
    assert all(len(message) <= limit for message, _ in messages)
    assert joined(messages) == [zmqpush.valid_utf8(line) for line in expected_lines(data)]


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


@pytest.mark.parametrize("limit, ending", [(None, b"\n"), (None, b""), (4, b"\n"), (10, b"")])
def test_a_message_stays_within_the_limit_after_invalid_utf8_became_u_fffd(receiver, limit,
                                                                            ending):
    """Each invalid byte becomes the 3 bytes of U+FFFD: 70,000 of them are 210,000
    bytes of message, which must still leave in pieces of at most --max-line-bytes
    (64 KiB by default) that join back to the repaired line, with or without a
    final newline."""
    args = ["-c", receiver.endpoint] + (["--max-line-bytes", str(limit)] if limit else [])
    count = 70_000 if limit is None else 50
    proc = run(args, b"\xff" * count + ending)
    assert proc.returncode == 0, proc.stderr
    receiver.settle()
    events = receiver.events()
    assert all(len(e["message"].encode()) <= (limit or 64 << 10) for e in events)
    assert "".join(e["message"] for e in events) == "\ufffd" * count
    assert all(e.get("@continues") for e in events[:-1]) and "@continues" not in events[-1]


# -- 1. supervision: a failing task ends the run -------------------------------------

def no_traceback(proc_stderr: bytes) -> list:
    """stderr's lines (without their time stamps), after checking that none
    belongs to a traceback."""
    text = unstamped(proc_stderr).decode(errors="replace")
    assert "Traceback" not in text and "never retrieved" not in text, text
    return text.splitlines()


def test_stdin_opened_write_only_ends_the_run_with_exit_1_and_one_line(tmp_path):
    """Before the fix the reader's EBADF left the run waiting forever."""
    with open(tmp_path / "f", "wb") as write_only:
        proc = run(["-c", "tcp://127.0.0.1:9", "-q", "--linger", "1"], stdin=write_only,
                   timeout=20)
    assert proc.returncode == 1
    lines = no_traceback(proc.stderr)
    assert lines[0] == "zmqpush: reading stdin failed: Bad file descriptor", lines
    assert lines[1].startswith("Processed 0 messages") and len(lines) == 2


def test_stdin_socket_reset_by_its_peer_delivers_what_was_read_and_exits_1(receiver):
    with socket.create_server(("127.0.0.1", 0)) as server:
        peer = socket.create_connection(server.getsockname())
        stdin, _ = server.accept()
    try:
        proc = start(["-c", receiver.endpoint, "-q", "--linger", "2"], stdin=stdin)
        peer.sendall(b"".join(b"before reset %d\n" % i for i in range(100)))
        assert receiver.wait_for(100, 20) == 100
        peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        peer.close()  # with linger 0: RST
        assert proc.wait(20) == 1
        lines = no_traceback(proc.stderr.read())
        assert lines[0] == "zmqpush: reading stdin failed: Connection reset by peer", lines
        assert receiver.messages() == [f"before reset {i}" for i in range(100)]
    finally:
        stdin.close()
        stop_process(proc)


FAILING_CALLBACK = """
import sys
import zmqpush
def broken(self):
    raise RuntimeError("boom")
zmqpush.Reporter.print_stats = broken
sys.exit(zmqpush.main(sys.argv[1:]))
"""

FAILING_ENCODER = """
import sys
import zmqpush
encode = zmqpush.Encoder.encode
def encode_once(self, lines, *args):
    if b"fail" in lines:
        raise ValueError("cannot encode")
    return encode(self, lines, *args)
zmqpush.Encoder.encode = encode_once
sys.exit(zmqpush.main(sys.argv[1:]))
"""


def start_patched(script: str, args: list) -> subprocess.Popen:
    """zmqpush.main() with a part replaced by script, stdin a pipe."""
    return subprocess.Popen(python_script(script, *args),
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, env=env_with(None))


def test_an_exception_in_a_loop_callback_ends_the_run_with_exit_1(receiver):
    """A --stats timer that raises goes to the loop's exception handler: the run
    ends as at EOF (what was read is delivered) and says why in one line."""
    proc = start_patched(FAILING_CALLBACK, ["-c", receiver.endpoint, "-q", "--stats", "0.5"])
    try:
        proc.stdin.write(b"one\ntwo\n")
        proc.stdin.flush()
        assert proc.wait(20) == 1  # stdin is still open: only the failure ends it
        lines = no_traceback(proc.stderr.read())
        assert lines[0].startswith("zmqpush: RuntimeError: boom ("), lines
        assert len(lines) == 2 and lines[1].startswith("Processed 2 messages")
        assert receiver.messages() == ["one", "two"]
    finally:
        stop_process(proc)


def test_a_failing_reader_task_still_delivers_what_it_queued(receiver):
    proc = start_patched(FAILING_ENCODER, ["-c", receiver.endpoint, "-q"])
    try:
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 20) == 1
        proc.stdin.write(b"fail\n")
        proc.stdin.flush()
        assert proc.wait(20) == 1
        lines = no_traceback(proc.stderr.read())
        assert lines[0] == "zmqpush: reading stdin failed: ValueError: cannot encode", lines
        assert receiver.messages() == ["first"]
    finally:
        stop_process(proc)


# -- 2. closed standard descriptors -----------------------------------------------------

def closing(fd: int):
    """A preexec_fn that closes fd in the child, as `N>&-` does in a shell."""
    return lambda: os.close(fd)


@pytest.mark.parametrize(("fd", "extra"), [(2, []), (1, []), (1, ["--confirm"])],
                         ids=["2>&-", ">&-", "--confirm >&-"])
def test_closed_stdout_or_stderr_never_aborts(receiver, fd, extra):
    data = b"".join(b"%d\n" % i for i in range(1000))
    proc = subprocess.run(cli("-c", receiver.endpoint, *extra), input=data,
                          capture_output=True, timeout=30, env=env_with(None),
                          preexec_fn=closing(fd))
    assert proc.returncode == 0, (proc.returncode, proc.stderr)
    if extra:  # nobody can read the replies: nothing is read, so nothing is lost
        assert receiver.settle(0.3) == 0
    else:
        assert receiver.wait_for(1000, 20) == 1000


def test_a_directory_as_stdin_is_refused_before_anything_is_sent(receiver, tmp_path):
    """CPython refuses to start with a directory as stdin, before the script's
    first line (README "Exit codes and signals"): zmqpush cannot catch it, but nothing is
    sent and the exit code says it failed."""
    directory = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        proc = run(["-c", receiver.endpoint], stdin=directory, timeout=20)
    finally:
        os.close(directory)
    assert proc.returncode == 1
    assert b"<stdin> is a directory" in proc.stderr
    assert receiver.settle(0.3) == 0


def test_closed_stdin_reads_as_empty_input(receiver):
    proc = subprocess.run(cli("-c", receiver.endpoint), capture_output=True, timeout=30,
                          env=env_with(None), stdin=subprocess.DEVNULL,
                          preexec_fn=closing(0))
    assert proc.returncode == 0, proc.stderr
    assert closing_count(proc.stderr) == 0


def test_watermark_tool_with_stdout_closed_or_broken_exits_1_without_traceback():
    closed = subprocess.run([WATERMARK, "--json"], capture_output=True,
                            timeout=20, preexec_fn=closing(1))
    assert closed.returncode == 1
    lines = no_traceback(closed.stderr)
    assert len(lines) == 1 and unstamped(lines[0]).startswith("zmqpush: "), lines
    read_end, write_end = os.pipe()
    os.close(read_end)  # like `| head -c0`
    try:
        broken = subprocess.run([WATERMARK, "--json"], stdout=write_end,
                                stderr=subprocess.PIPE, timeout=20)
    finally:
        os.close(write_end)
    assert broken.returncode == 1 and broken.stderr == b""


@pytest.mark.parametrize("args", [["--sndhwm", "0"], ["-c", "tcp://127.0.0.1:*"],
                                  ["-c", "ipc:///tmp/" + "x" * 200]],
                         ids=["bad value", "refused by ZeroMQ", "ipc path too long"])
def test_watermark_tool_usage_errors_exit_2_like_zmqpush(args):
    tool = subprocess.run([WATERMARK, *args], capture_output=True,
                          timeout=20)
    shipper = run(args, b"x\n", timeout=20)
    assert tool.returncode == shipper.returncode == 2, (tool.stderr, shipper.stderr)
    assert len(no_traceback(tool.stderr)) == 1 and len(no_traceback(shipper.stderr)) == 1


# -- 3. drop mode -----------------------------------------------------------------------

def test_drop_mode_reads_a_regular_file_with_policy_block(receiver, tmp_path):
    """Nothing upstream waits on a file: dropping would only lose lines."""
    path = tmp_path / "in.log"
    path.write_bytes(b"".join(b"file line %d\n" % i for i in range(200_000)))
    with open(path, "rb") as f:
        proc = run(["-c", receiver.endpoint, "--when-full", "drop", "--queue-bytes", "10000"],
                   stdin=f, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert b"Dropped" not in proc.stderr
    assert receiver.wait_for(200_000, 60) == 200_000
    assert closing_count(proc.stderr) == 200_000


def test_drop_mode_on_dev_zero_still_answers_signals_and_stats():
    """/dev/zero never blocks: the reader must yield for --stats, SIGUSR1 and SIGTERM."""
    with open("/dev/zero", "rb") as zero:
        proc = start(["-c", "tcp://127.0.0.1:9", "-q", "--when-full", "drop", "--linger", "1",
                      "--stats", "0.2", "--max-line-bytes", "1000"], stdin=zero)
    try:
        wait_stop_signals_taken(proc)  # a SIGTERM while it starts would end it unread: 0
        time.sleep(1.0)
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.3)
        os.kill(proc.pid, signal.SIGTERM)
        assert proc.wait(15) == 3  # read, not delivered: the receiver is down
        lines = no_traceback(proc.stderr.read())
        assert sum(unstamped(line).startswith("zmqpush: read=") for line in lines) >= 3, lines
        assert not any("dropped=0" not in line for line in lines
                       if unstamped(line).startswith("zmqpush: read="))
    finally:
        stop_process(proc)


def test_drops_make_the_exit_code_3():
    """--when-full drop from a pipe with the receiver down: lines are dropped, exit 3."""
    proc = run(["-c", "tcp://127.0.0.1:9", "-q", "--when-full", "drop", "--queue-bytes", "1000",
                "--linger", "0.5"], b"".join(b"%d\n" % i for i in range(50_000)), timeout=30)
    assert proc.returncode == 3
    assert b"Dropped " in proc.stderr


# -- 4. option values that must do what they say ---------------------------------------

def test_confirm_counts_refused_lines_not_their_pieces():
    """A line cut into pieces by --max-line-bytes gets one reply, and counts as one
    refused line in the closing words."""
    proc = start(["t", "--confirm", "-c", "tcp://127.0.0.1:9", "--linger", "0.5",
                  "--max-line-bytes", "65536"])
    try:
        assert proc.stdout.readline() == b"OK\n"
        for i in range(3):
            proc.stdin.write(b"%d %s\n" % (i, b"x" * 200_000))
            proc.stdin.flush()
            assert proc.stdout.readline().startswith(b"zmqpush: not accepted")
        proc.stdin.close()
        proc.wait(20)
        assert b". Refused 3 lines to rsyslog" in proc.stderr.read()
    finally:
        stop_process(proc)


def test_confirm_timeout_0_accepts_what_zeromq_takes_at_once(receiver):
    """Before the fix every line was refused: wait_for(..., 0) never ran the flush.
    Lines come as rsyslog sends them, each after the previous one's reply."""
    proc = start(["-c", receiver.endpoint, "--confirm", "--confirm-timeout", "0"])
    try:
        assert proc.stdout.readline() == b"OK\n"
        # With no receiver connected yet ZeroMQ (IMMEDIATE=1) would refuse at once.
        assert unstamped(proc.stderr.readline()).startswith(b"zmqpush: receiver connected")
        for line in (b"a\n", b"b\n", b"c\n"):
            proc.stdin.write(line)
            proc.stdin.flush()
            assert proc.stdout.readline() == b"OK\n"
        proc.stdin.close()
        assert proc.wait(20) == 0, proc.stderr.read()
        assert receiver.wait_for(3, 10) == 3
    finally:
        stop_process(proc)


@pytest.mark.parametrize("extra", [[], ["--confirm"]], ids=["plain", "confirm"])
def test_linger_0_ends_at_once_and_exits_3_since_delivery_was_not_awaited(receiver, extra):
    proc = run(["-c", receiver.endpoint, "--linger", "0", *extra],
               b"".join(b"%d\n" % i for i in range(1000)), timeout=20)
    assert proc.returncode == 3
    lines = no_traceback(proc.stderr)
    assert "zmqpush: --linger 0: delivery was not waited for" in lines


@pytest.mark.parametrize("option", ["--linger", "--confirm-timeout"])
def test_minus_zero_seconds_is_zero(receiver, option):
    proc = run(["-c", receiver.endpoint, option, "-0", "--linger", "-0", "--stats", "-0"],
               b"one\n")
    text = proc.stderr.decode()
    assert proc.returncode == 3 and "-0" not in text, text
    assert "zmqpush: --linger 0: delivery was not waited for" in text


def test_linger_0_with_nothing_read_exits_0(receiver):
    assert run(["-c", receiver.endpoint, "--linger", "0"], b"", timeout=20).returncode == 0


def test_ipc_path_too_long_is_a_usage_error():
    line = one_usage_line(run(["-c", "ipc:///tmp/" + "x" * 200], b"x\n", timeout=20))
    assert "cannot use endpoint" in line


def ipv6_pull(endpoint: str, bind: bool):
    import zmq
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.IPV6, 1)
    sock.setsockopt(zmq.LINGER, 0)
    (sock.bind if bind else sock.connect)(endpoint)
    return sock


@pytest.mark.parametrize("mode", ["--connect", "--bind"])
def test_ipv6_loopback_works_to_connect_and_to_bind(mode):
    with socket.socket(socket.AF_INET6) as s:
        s.bind(("::1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://[::1]:{port}"
    sock = ipv6_pull(endpoint, bind=mode == "--connect")
    proc = start([mode, endpoint, "-q"])
    try:
        proc.stdin.write(b"over ipv6\n")
        proc.stdin.close()
        assert sock.poll(10_000), "nothing arrived over IPv6"
        assert json.loads(sock.recv())["message"] == "over ipv6"
        assert proc.wait(10) == 0, proc.stderr.read()
    finally:
        sock.close()
        stop_process(proc)


@pytest.mark.parametrize("delay", [0.0, 0.02, 0.04, 0.06, 0.09, 0.12])
def test_sigint_during_start_up_never_gives_a_traceback(delay):
    """From the script's first lines (seen as SIGHUP ignored) SIGINT waits,
    blocked, until the loop's handlers take it; then it ends the run as
    documented (0).  (Before the script's first line the interpreter's own
    start cannot be covered.)"""
    proc = start(["-c", "tcp://127.0.0.1:9", "--linger", "0.5"])
    try:
        deadline = time.monotonic() + 10
        while not ignored_signals(proc.pid) & (1 << (signal.SIGHUP - 1)):
            assert time.monotonic() < deadline, "the script never started"
            time.sleep(0.001)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        proc.stdin.close()
        code = proc.wait(10)
        err = proc.stderr.read()
        assert b"Traceback" not in err and b"KeyboardInterrupt" not in err, err
        assert code == 0, (code, err)
        assert closing_count(err) == 0
    finally:
        stop_process(proc)


def assert_ran_and_shipped(proc, err: bytes, receiver, lines: list):
    """The run ended 0, its closing line counted the lines, and the receiver got them."""
    assert proc.returncode == 0, (proc.returncode, err)
    assert closing_count(err) == len(lines), err
    assert receiver.wait_for(len(lines), 10) == len(lines)
    assert receiver.messages() == lines


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
@pytest.mark.parametrize("since, delay", [("exec", 0.0), ("exec", 0.01), ("exec", 0.03),
                                          ("exec", 0.06), ("launcher", 0.0),
                                          ("launcher", 0.01), ("launcher", 0.03),
                                          ("launcher", 0.06)])
def test_a_stop_signal_during_start_up_ships_the_lines_already_waiting(receiver, signum,
                                                                       since, delay):
    """A SIGTERM or SIGINT that comes while zmqpush starts (delay after the exec, or
    after the launcher's first lines, seen as SIGHUP ignored) waits, blocked, until
    the run takes it: the two lines already in the pipe, whose writer stays open,
    are shipped, the closing line follows and the exit code is 0, as README
    "Signals" says.  Only a signal sent before the launcher's first line (the
    interpreter's own start) may still end the process its default way, or be
    dropped there by CPython: a KeyboardInterrupt it printed ("Exception ignored
    in", from a weakref callback of its imports) and zmqpush ran on unsignalled
    (then its input is ended here)."""
    read_end, write_end = os.pipe()
    os.write(write_end, b"early one\nearly two\n")
    proc = start(["-c", receiver.endpoint], stdin=read_end)
    os.close(read_end)
    try:
        deadline = time.monotonic() + 10
        while since == "launcher" and not ignored_signals(proc.pid) & (1 << (signal.SIGHUP - 1)):
            assert time.monotonic() < deadline, "the launcher never ran"
            time.sleep(0.0005)
        time.sleep(delay)
        launched = ignored_signals(proc.pid) & (1 << (signal.SIGHUP - 1))
        proc.send_signal(signum)
        try:
            err = proc.communicate(timeout=30)[1]
        except subprocess.TimeoutExpired:
            if launched or signum != signal.SIGINT:
                raise
            os.close(write_end)
            write_end = None
            err = proc.communicate(timeout=30)[1]
            assert b"Exception ignored in" in err and b"KeyboardInterrupt" in err, err
        if not launched and proc.returncode in (-signum, 1):
            return  # the interpreter's start, before any line of zmqpush ran
        assert_ran_and_shipped(proc, err, receiver, ["early one", "early two"])
    finally:
        if write_end is not None:
            os.close(write_end)
        stop_process(proc)


# A sitecustomize (found on PYTHONPATH) whose path hook interrupts CPython as it checks
# whether the script's path is an import path entry, just before it runs the script.
INTERRUPT_AT_THE_SCRIPT_PATH = """\
import os, signal, sys

def interrupt_at_the_script_path(path):
    if path == sys.argv[0]:
        sys.path_hooks.remove(interrupt_at_the_script_path)
        os.kill(os.getpid(), signal.SIGINT)
    raise ImportError

sys.path_hooks.insert(0, interrupt_at_the_script_path)
"""


@pytest.mark.parametrize("command", ["installed", "checkout"])
def test_a_sigint_cpython_drops_just_before_the_script_still_stops_the_run(
        receiver, tmp_path, command):
    """A SIGINT that comes while CPython checks the script's path (the last moment before
    its first line) raises a KeyboardInterrupt that CPython prints ("Failed checking if
    argv[0] is an import path entry") and drops, then runs the script all the same: the
    launcher (or the script) sends it again, so it waits as any start-up signal does and
    the lines waiting are shipped (a whole-suite run hung there, 1 start in ~500 under load)."""
    (tmp_path / "sitecustomize.py").write_text(INTERRUPT_AT_THE_SCRIPT_PATH)
    args = ["-c", receiver.endpoint]
    read_end, write_end = os.pipe()
    os.write(write_end, b"early one\nearly two\n")
    proc = subprocess.Popen(cli(*args) if command == "installed" else
                            [sys.executable, CHECKOUT_ZMQPUSH, *args],
                            stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_with({"PYTHONPATH": str(tmp_path)}))
    os.close(read_end)
    try:
        err = proc.communicate(timeout=20)[1]
        assert b"Failed checking if argv[0]" in err, err  # the SIGINT came where meant
        assert_ran_and_shipped(proc, err, receiver, ["early one", "early two"])
    finally:
        os.close(write_end)
        stop_process(proc)


# A REPL where Ctrl-C was pressed once at the prompt (the code module, IDLE and IPython
# alike leave that KeyboardInterrupt in sys.last_value), then zmqpush run in it by
# runpy, as IPython's %run runs a script: argv is the script and its arguments.
RUN_AFTER_A_CTRL_C_AT_A_PROMPT = """\
import code, runpy, sys
code.InteractiveConsole().push("raise KeyboardInterrupt")
assert isinstance(sys.last_value, KeyboardInterrupt)
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


@pytest.mark.parametrize("command", ["installed", "checkout"])
def test_a_ctrl_c_a_repl_took_before_does_not_stop_a_run_it_starts(receiver, command):
    """sys.last_value is a KeyboardInterrupt in a REPL that took a Ctrl-C long before:
    zmqpush run in that process is not interrupted and reads on until its input ends
    (only a KeyboardInterrupt CPython dropped just before it ran the script itself is
    sent again: a stop then would read only what waits in the pipe)."""
    script = ZMQPUSH if command == "installed" else CHECKOUT_ZMQPUSH
    read_end, write_end = os.pipe()
    os.write(write_end, b"early one\n")
    proc = subprocess.Popen(python_script(RUN_AFTER_A_CTRL_C_AT_A_PROMPT, script,
                                          "-c", receiver.endpoint),
                            stdin=read_end, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env=env_with({}))
    os.close(read_end)
    try:
        assert receiver.wait_for(1, 20) == 1
        try:
            os.write(write_end, b"late two\n")
        except BrokenPipeError:  # it stopped after the first line: the assertions say so
            pass
        os.close(write_end)
        write_end = None
        err = proc.communicate(timeout=20)[1]
        assert_ran_and_shipped(proc, err, receiver, ["early one", "late two"])
    finally:
        if write_end is not None:
            os.close(write_end)
        stop_process(proc)


def test_on_off_environment_values_must_be_on_or_off():
    """ZMQPUSH_CONFIRM=enabled must not quietly mean off under rsyslog."""
    bad = run([], b"", timeout=10, env={"ZMQPUSH_CONFIRM": "enabled"})
    assert bad.returncode == 2 and b"ZMQPUSH_CONFIRM" in bad.stderr
    off = run(["-c", "tcp://127.0.0.1:9", "--linger", "0.2"], b"", timeout=10,
              env={"ZMQPUSH_CONFIRM": "off", "ZMQPUSH_BATCH": ""})
    assert off.returncode == 0 and off.stdout == b""


def test_connecting_to_port_0_is_a_usage_error():
    proc = run(["-c", "tcp://127.0.0.1:0"], b"x\n", timeout=10)
    assert proc.returncode == 2 and b"a port is needed" in proc.stderr


def test_confirm_with_a_stdout_reader_that_stopped_still_obeys_sigterm(receiver):
    """Replies wait for stdout without blocking the loop: SIGTERM ends the run
    within --linger even while nobody reads them."""
    read_end, write_end = os.pipe()
    proc = start(["--confirm", "-c", receiver.endpoint, "--linger", "1"], stdout=write_end)
    os.close(write_end)
    data = b"".join(b"%d\n" % i for i in range(100_000))
    threading.Thread(target=write_quietly, args=(proc, data), daemon=True).start()
    try:
        time.sleep(2)  # the 64 KiB pipe is full of replies by now
        began = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(15)
        assert time.monotonic() - began < 10
        assert code in (0, 3)
        assert b"Traceback" not in proc.stderr.read()
    finally:
        os.close(read_end)
        stop_process(proc)


def write_quietly(proc, data: bytes):
    """Write data to proc's stdin (it may stop reading, or exit)."""
    try:
        proc.stdin.write(data)
        proc.stdin.close()
    except (BrokenPipeError, ValueError):
        pass


def test_a_terminal_line_followed_at_once_by_end_of_file_ends_the_run(receiver):
    """On a terminal, an end of file (^D) typed right after a line holds no byte
    and brings no edge of its own: after the line, the reader must read on (it
    trusts an empty FIONREAD on pipes only), or the run never ends."""
    master, slave = pty.openpty()
    proc = start(["-c", receiver.endpoint], stdin=slave)
    os.close(slave)
    try:
        time.sleep(1.5)  # the reader waits on the terminal by now
        os.write(master, b"a line\n\x04")
        assert receiver.wait_for(1, timeout=10) == 1
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
        os.close(master)


def packet_source(kind: str) -> tuple:
    """(read end, send, close, largest packet) of a packet source: a packet-mode
    pipe (O_DIRECT: the kernel cuts a write into packets of a page), or a
    SEQPACKET or datagram socket pair whose sender may send as much as its
    send buffer holds in one packet."""
    if kind == "packet-pipe":
        read_end, write_end = os.pipe2(os.O_DIRECT)
        return (read_end, lambda data: os.write(write_end, data),
                lambda: os.close(write_end), 1 << 20)
    kinds = {"seqpacket": socket.SOCK_SEQPACKET, "dgram": socket.SOCK_DGRAM}
    ours, theirs = socket.socketpair(socket.AF_UNIX, kinds[kind])
    ours.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 1 << 20)
    ours.settimeout(20)
    largest = ours.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF) - 1024
    return theirs.detach(), ours.send, ours.close, largest


def wait_for_events(receiver, count: int, timeout: float = 30.0) -> int:
    """Wait until count events (array elements too) arrived or timeout."""
    deadline = time.monotonic() + timeout
    while len(receiver.events()) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return len(receiver.events())


@pytest.mark.parametrize("kind, args", [
    ("seqpacket", []), ("seqpacket", ["--batch", "--batch-bytes", "100"]), ("dgram", []),
    ("packet-pipe", []), ("packet-pipe", ["--batch", "--batch-bytes", "100"]),
    ("packet-pipe", ["--batch", "--batch-bytes", "4000"])])
def test_a_packet_source_loses_no_byte_whatever_its_packet_and_read_sizes(receiver, kind, args):
    """A read of a packet source returns one packet, and the kernel discards what
    does not fit.  A small packet, one of 500 lines (45,500 bytes), one as large
    as the sender's buffer allows (past the default read size where it can), and
    another small one: every line arrives as written, none lost, none joined."""
    read_end, send, close, largest = packet_source(kind)
    line = b"%05d" + b"x" * 85 + b"\n"
    packets = [b"small-1\n", b"".join(line % n for n in range(500)),
               b"".join(line % n for n in range(min(3300, largest // len(line % 0)))),
               b"small-2\n"]
    expected = [text.decode() for p in packets for text in p.split(b"\n")[:-1]]
    proc = start(["-c", receiver.endpoint, *args], stdin=read_end)
    os.close(read_end)
    try:
        for packet in packets:
            assert send(packet) == len(packet)
        assert wait_for_events(receiver, len(expected)) >= len(expected)
        if kind == "dgram":  # a datagram socket never ends
            proc.send_signal(signal.SIGTERM)
        close()
        err = proc.communicate(timeout=30)[1]
        assert proc.returncode == 0, err
        assert closing_count(err) == len(expected)
        assert receiver.messages() == expected
    finally:
        stop_process(proc)


@pytest.mark.parametrize("kind", ["packet-pipe", "seqpacket"])
def test_input_whose_reads_stop_short_with_data_left_is_shipped_while_the_writer_waits(
        receiver, kind):
    """A short read does not prove stdin empty: a packet-mode pipe (O_DIRECT on the
    writer's end) or a SEQPACKET socket returns one write per read.  Every line must
    go out while the writer is still open and quiet, not when it closes."""
    if kind == "packet-pipe":
        read_end, write_end = os.pipe2(os.O_DIRECT)
        send = lambda data: os.write(write_end, data)  # noqa: E731
        close = lambda: os.close(write_end)  # noqa: E731
    else:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, send, close = theirs.detach(), ours.send, ours.close
    proc = start(["-c", receiver.endpoint], stdin=read_end)
    os.close(read_end)
    try:
        for i in range(3):
            send(b"".join(b"line %d.%03d\n" % (i, n) for n in range(100)))
        assert receiver.wait_for(300, timeout=10) == 300
        close()
        assert proc.wait(30) == 0
    finally:
        stop_process(proc)
