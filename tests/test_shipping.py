"""Issue 2: the shipper end to end through real sockets and the real CLI."""
import json
import os
import pty
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import (
    WATERMARK,
    ZMQPUSH,
    Receiver,
    closing_count,
    env_with,
    free_port,
    python_script,
    run,
    start,
    stop_process,
    unstamped,
)


def test_wire_format_is_the_originals_byte_for_byte(receiver):
    proc = run(["-c", receiver.endpoint], b"hello world\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    pid = int(proc.stderr.decode().rsplit("@pid:", 1)[1])
    assert receiver.frames == [
        b'{"message":"hello world","type":"syslog","@pid":%d}' % pid]
    assert closing_count(proc.stderr) == 1
    assert proc.stdout == b""


def test_round_trip_of_100k_lines_is_exact_and_in_order(receiver):
    rnd = random.Random(7)
    alphabet = 'abc xyz"\\\t/{}[]:,é€😀\x01\x1f'
    lines = ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 120)))
             for _ in range(100_000)]
    data = "".join(line + "\n" for line in lines).encode()
    proc = run(["-c", receiver.endpoint, "app"], data)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(100_000) == 100_000
    events = receiver.events()
    assert [e["message"] for e in events] == lines
    assert {e["type"] for e in events} == {"app"}
    assert closing_count(proc.stderr) == 100_000


def test_every_byte_value_invalid_utf8_crlf_and_no_final_newline(receiver):
    all_bytes = bytes(b for b in range(256) if b != 0x0A)
    lines = [all_bytes, b"\xff\xfe\xc0\xaf broken \xed\xa0\x80", b"windows\r", b"",
             b"cr\rinside", b"two crs\r\r"]
    data = b"".join(line + b"\n" for line in lines) + b"last without newline\r"
    proc = run(["-c", receiver.endpoint], data)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(7) == 7
    expected = [all_bytes, lines[1], b"windows", b"", b"cr\rinside", b"two crs\r",
                b"last without newline\r"]
    assert receiver.messages() == [e.decode("utf-8", "replace") for e in expected]


def test_one_mebibyte_line_arrives_whole_up_to_max_line_bytes(receiver):
    line = (b"0123456789abcdef" * 65536)
    assert len(line) == 1 << 20
    proc = run(["-c", receiver.endpoint, "--max-line-bytes", str(1 << 20),
                "--memory-bytes", str(128 << 20)], line + b"\nnext\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(2) == 2
    assert receiver.messages() == [line.decode(), "next"]


def test_logtype_with_quotes_and_controls_is_escaped(receiver):
    logtype = 'my "app"\\\t\x01'
    proc = run(["-c", receiver.endpoint, logtype], b"x\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    assert receiver.events()[0]["type"] == logtype


def test_receiver_started_two_seconds_late_loses_nothing():
    port = free_port()
    proc = start(["-c", f"tcp://127.0.0.1:{port}", "--linger", "4.5"])
    proc.stdin.write(b"".join(b"line %d\n" % i for i in range(3000)))
    proc.stdin.close()
    time.sleep(2)
    receiver = Receiver(port)
    try:
        assert proc.wait(30) == 0, proc.stderr.read()
        assert receiver.wait_for(3000) == 3000
        assert receiver.messages() == [f"line {i}" for i in range(3000)]
    finally:
        receiver.stop()
        stop_process(proc)


def test_eof_with_receiver_down_exits_3_in_bounded_time_and_counts():
    port = free_port()
    began = time.monotonic()
    proc = run(["-c", f"tcp://127.0.0.1:{port}", "--linger", "1"],
               b"".join(b"%d\n" % i for i in range(5000)), timeout=20)
    took = time.monotonic() - began
    assert proc.returncode == 3
    err = proc.stderr.decode()
    # Nothing is queued in ZeroMQ for a receiver that is not connected (IMMEDIATE=1).
    assert "zmqpush: 5000 messages were not handed to ZeroMQ" in err
    assert "ZeroMQ still held undelivered messages" not in err
    assert closing_count(proc.stderr) == 0
    assert took < 10


def test_short_input_returns_promptly_with_receiver_up(receiver):
    proc = run(["-c", receiver.endpoint], b"test\n", timeout=10)
    assert proc.returncode == 0
    assert receiver.wait_for(1) == 1


def test_regular_file_on_stdin(receiver, tmp_path):
    path = tmp_path / "in.log"
    path.write_bytes(b"".join(b"file line %d\n" % i for i in range(10_000)))
    with open(path, "rb") as f:
        proc = run(["-c", receiver.endpoint], stdin=f)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(10_000) == 10_000
    assert receiver.messages()[-1] == "file line 9999"


def test_dev_null_on_stdin_sends_nothing_and_exits_0(receiver):
    with open(os.devnull, "rb") as f:
        proc = run(["-c", receiver.endpoint], stdin=f, timeout=10)
    assert proc.returncode == 0, proc.stderr
    assert closing_count(proc.stderr) == 0
    assert receiver.settle(0.3) == 0


def test_terminal_on_stdin_and_its_flags_restored(receiver):
    master, slave = pty.openpty()
    try:
        proc = start(["-c", receiver.endpoint], stdin=slave)
        os.write(master, b"typed line\n")
        assert receiver.wait_for(1, 10) == 1
        os.write(master, b"\x04")  # ^D at the start of a line: EOF
        assert proc.wait(10) == 0
        assert os.get_blocking(slave), "zmqpush left the terminal non-blocking"
        assert receiver.messages() == ["typed line"]
    finally:
        stop_process(proc)
        os.close(master)
        os.close(slave)


def test_two_receivers_share_the_stream_and_the_total_is_exact():
    a, b = Receiver(free_port()), Receiver(free_port())
    try:
        proc = run(["-c", a.endpoint, "-c", b.endpoint],
                   b"".join(b"%d\n" % i for i in range(20_000)))
        assert proc.returncode == 0, proc.stderr
        a.settle(), b.settle()
        assert len(a.frames) > 0 and len(b.frames) > 0
        got = sorted(int(m) for m in a.messages() + b.messages())
        assert got == list(range(20_000))
    finally:
        a.stop()
        b.stop()


def test_connect_from_environment_variable(receiver):
    proc = run([], b"via env\n", env={"ZMQPUSH_CONNECT": receiver.endpoint})
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1


def test_bind_for_a_logstash_input_in_client_mode():
    port = free_port()
    proc = start(["--bind", f"tcp://127.0.0.1:{port}"])
    import zmq
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(f"tcp://127.0.0.1:{port}")
        proc.stdin.write(b"bound\n")
        proc.stdin.close()
        assert sock.poll(10_000), "nothing arrived"
        assert json.loads(sock.recv())["message"] == "bound"
        assert proc.wait(10) == 0
    finally:
        sock.close()
        stop_process(proc)


def test_bad_endpoints_and_options_are_one_line_usage_errors():
    for args in (["-c", "localhost:2120"], ["-c", "tcp://127.0.0.1"],
                 ["-c", "tcp://127.0.0.1:99999"], ["--bind", "udp://x:1"],
                 ["--linger", "-1"], ["--sndhwm", "0"], ["--nope"],
                 ["--write-buffer-limits", "10,20"]):
        proc = run(args, b"never read\n", timeout=10)
        assert proc.returncode == 2, args
        lines = proc.stderr.decode().splitlines()
        assert len(lines) == 1 and unstamped(lines[0]).startswith("zmqpush: "), (args, lines)
        assert b"Traceback" not in proc.stderr


def test_endpoint_zeromq_refuses_is_a_usage_error_before_reading():
    proc = run(["--bind", "tcp://nosuchif0:5555"], b"x\n", timeout=10)
    assert proc.returncode == 2
    assert unstamped(proc.stderr.decode()).startswith("zmqpush: cannot use endpoint")
    assert len(proc.stderr.decode().splitlines()) == 1
    wildcard = run(["-c", "tcp://127.0.0.1:*"], b"x\n", timeout=10)
    assert wildcard.returncode == 2 and b"a port is needed" in wildcard.stderr


def test_bind_address_in_use_is_a_runtime_error():
    import socket
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(["--bind", f"tcp://127.0.0.1:{port}"], b"x\n", timeout=10)
    assert proc.returncode == 1
    assert unstamped(proc.stderr.decode()).startswith("zmqpush: cannot use endpoint")
    assert b"Traceback" not in proc.stderr


def test_help_explains_and_version_prints():
    helped = run(["--help"])
    assert helped.returncode == 0 and helped.stderr == b"", helped.stderr
    out = helped.stdout.decode()
    for word in ("LOGTYPE", "--connect", "--bind", "--linger", "tail -n0 -F", "--help-all"):
        assert word in out
    everything = run(["--help-all"])
    assert everything.returncode == 0 and everything.stderr == b"", everything.stderr
    out = everything.stdout.decode()
    for word in ("LOGTYPE", "--connect", "--bind", "--linger", "--sndhwm",
                 "--write-buffer-limits", "exit codes", "omprog", "tail -n0 -F"):
        assert word in out
    version = run(["--version"])
    assert version.returncode == 0 and version.stderr == b"", version.stderr
    assert version.stdout.decode().startswith("zmqpush ")


def test_watermark_tool_prints_the_originals_lines_then_zeromq_and_kernel():
    proc = subprocess.run([WATERMARK], capture_output=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.decode().splitlines()
    assert lines[:2] == ["Low watermark: 0", "High watermark: 65536"]
    assert lines[2] == "ZeroMQ SNDHWM: 1000 messages"
    assert lines[3].startswith("ZeroMQ SNDBUF: ")
    assert lines[4].startswith("net.ipv4.tcp_wmem: ")


def test_watermark_tool_json_follows_the_options():
    proc = subprocess.run([WATERMARK, "--json", "--sndhwm", "42",
                           "--write-buffer-limits", "8000,2000"],
                          capture_output=True, timeout=10)
    assert proc.returncode == 0, proc.stderr
    values = json.loads(proc.stdout)
    assert values["low_watermark"] == 2000 and values["high_watermark"] == 8000
    assert values["sndhwm"] == 42
    assert set(values) == {"low_watermark", "high_watermark", "sndhwm", "sndbuf",
                           "tcp_wmem"}



@pytest.mark.parametrize("args,sndhwm", [(["--confirm"], 1), (["--confirm", "--sndhwm", "7"], 7),
                                         (["--confirm", "--spool", "spool"], 1000),
                                         (["--confirm", "--confirm-timeout", "0"], 1000),
                                         ([], 1000)],
                         ids=["confirm", "confirm-set", "confirm-spool", "confirm-at-once",
                              "default"])
def test_confirm_mode_lets_zeromq_hold_one_message(args, sndhwm, tmp_path):
    """--confirm answers OK once ZeroMQ took a line: what ZeroMQ still holds when
    zmqpush ends is lost (README "rsyslog"), so it holds one message unless told,
    or unless lines must be taken at once (a queue of one takes the next message
    only after ZeroMQ's I/O thread took the last)."""
    proc = subprocess.run([WATERMARK, "--json", *args], capture_output=True, timeout=10,
                          cwd=tmp_path)  # not the checkout: --spool spool may create it
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["sndhwm"] == sndhwm

SIMULATE_PY314 = """
import asyncio.unix_events as u, sys
del u.SafeChildWatcher
import zmqpush
sys.exit(zmqpush.main(sys.argv[1:]))
"""


def test_starts_where_asyncio_has_no_safechildwatcher_as_on_python_314(receiver):
    """On 3.14+ asyncio really lacks SafeChildWatcher and the command runs as installed;
    on older CPythons the removal is simulated before zmqpush.py runs."""
    real = sys.version_info >= (3, 14)
    remove = "" if real else "import asyncio.unix_events as u; del u.SafeChildWatcher; "
    broken = subprocess.run([sys.executable, "-c", remove + "import aiozmq"],
                            capture_output=True, timeout=20)
    assert broken.returncode != 0 and b"SafeChildWatcher" in broken.stderr
    if real:
        proc = run(["-c", receiver.endpoint], b"on 3.14\n", timeout=20)
    else:
        proc = subprocess.run(python_script(SIMULATE_PY314, "-c", receiver.endpoint),
                              input=b"on 3.14\n", capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1


WITHOUT_UVLOOP = """
import sys
sys.modules["uvloop"] = None  # import uvloop now raises ImportError
import zmqpush
sys.exit(zmqpush.main(sys.argv[1:]))
"""


def test_runs_on_the_default_asyncio_loop_when_uvloop_is_missing(receiver):
    proc = subprocess.run(python_script(WITHOUT_UVLOOP, "-q", "-c", receiver.endpoint),
                          input=b"no uvloop\n", capture_output=True, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.decode().splitlines()[0].startswith("Processed 1 messages")
    assert receiver.wait_for(1) == 1


def main_thread_switches(pid: int) -> int:
    """Voluntary plus involuntary context switches of a process's main thread."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return sum(int(line.split()[1]) for line in f if "ctxt_switches" in line)


def main_thread_wakeups(proc, seconds: float = 3.0) -> int:
    """The context switches of proc's main thread over the next seconds."""
    before = main_thread_switches(proc.pid)
    time.sleep(seconds)
    return main_thread_switches(proc.pid) - before


def wakeups_once_settled(proc, seconds: float = 3.0, timeout: float = 20.0) -> int:
    """The wake-ups of proc's main thread over `seconds`, in the first such window
    with none, for at most `timeout`: what follows start-up (connection events, the
    first delivery, the replay window's quiet checks) ends in a time the machine's
    load stretches, but a timer or poll timeout of up to `seconds` wakes the thread
    in every window.  A window is looked at once a sixth of it passed with no
    wake-up (so start-up costs a short window, not a whole one).  A sleeping
    thread's switches are its own: other processes' load adds none, so the tests
    that use this need not run alone."""
    deadline = time.monotonic() + timeout
    while True:
        if main_thread_wakeups(proc, seconds / 6) == 0 or time.monotonic() >= deadline:
            wakeups = main_thread_wakeups(proc, seconds)
            if wakeups == 0 or time.monotonic() >= deadline:
                return wakeups


@pytest.mark.parametrize("mode", [[], ["--batch"], ["--confirm"]],
                         ids=["default", "batch", "confirm"])
def test_idle_with_stdin_open_the_main_thread_never_wakes(receiver, mode):
    """No timer, no poll timeout: stdin open and silent means no wake-up at all."""
    proc = start(["-c", receiver.endpoint, *mode])
    try:
        proc.stdin.write(b"one line, then silence\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        assert wakeups_once_settled(proc) == 0
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


@pytest.mark.parametrize("mode", [[], ["--batch"], ["--confirm"]],
                         ids=["default", "batch", "confirm"])
def test_idle_with_the_receiver_down_the_main_thread_never_wakes(mode):
    """ZeroMQ retries the connection every second, but no event of it reaches
    the loop: only a one-time notice, 1 s after start, says it is retrying."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start(["-c", endpoint, "--linger", "0.5", *mode])
    try:
        proc.stdin.write(b"one line, no receiver\n")
        proc.stdin.flush()
        # after start-up, the one-time notice and the --confirm timeout (2 s)
        assert wakeups_once_settled(proc, 5.0, 30.0) == 0
        proc.stdin.close()
        # --confirm refused the line (rsyslog keeps it): no loss of zmqpush's
        assert proc.wait(10) == (0 if mode == ["--confirm"] else 3)
        err = proc.stderr.read().decode()
        assert f"zmqpush: no receiver yet (retrying every 1 s): {endpoint}" in err
    finally:
        stop_process(proc)


def test_installed_command_is_a_small_launcher_of_the_compiled_module(receiver):
    """pip install puts a launcher on PATH, not the module's source (a script is
    compiled at every start); it ships like zmqpush.py itself.  The install looked
    at is the one whose commands this session runs (conftest: this checkout's,
    installed by pip, on every CPython .ci/run runs these tests on)."""
    command = Path(ZMQPUSH)
    assert command.stat().st_size < 2048
    assert b"from zmqpush import main" in command.read_bytes()
    proc = subprocess.run([str(command), "-c", receiver.endpoint], input=b"via launcher\n",
                          capture_output=True, timeout=60, env=env_with({}), cwd="/")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    assert receiver.messages() == ["via launcher"]
