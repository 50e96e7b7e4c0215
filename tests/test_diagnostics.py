"""Issue 36: each zmqpush: diagnostic carries an ISO 8601 UTC time (ms) before its
prefix when stderr is a file or pipe, never when it is a terminal (a person
watches) or the journal (JOURNAL_STREAM names stderr: the journal stamps its own);
the closing line stays the original's."""
import datetime
import os
import pty
import re
import select
import subprocess
import time

from conftest import Receiver, cli, env_with, free_port, start, stop_process

STAMPED = re.compile(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3})Z zmqpush: ")
# One line read, --linger 0: one diagnostic says delivery was not waited for.
ARGS = ["-c", "tcp://127.0.0.1:9", "--linger", "0"]
SAID = "zmqpush: --linger 0: delivery was not waited for"


def run_with_stderr(stderr, env=None) -> int:
    proc = subprocess.run(cli(*ARGS), input=b"x\n", stdout=subprocess.DEVNULL,
                          stderr=stderr, env=env_with(env), timeout=30)
    return proc.returncode


def stderr_in_file(tmp_path, env_of=None) -> list:
    """The stderr lines of a run whose stderr is a file; env_of(stat of the
    file) gives its extra environment."""
    path = tmp_path / "stderr"
    with open(path, "wb") as err:
        env = env_of(os.fstat(err.fileno())) if env_of else None
        assert run_with_stderr(err, env) == 3
    return path.read_text().splitlines()


def test_diagnostics_written_to_a_file_carry_the_time(tmp_path):
    before = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    lines = stderr_in_file(tmp_path)
    after = datetime.datetime.now(datetime.timezone.utc).replace(tzinfo=None)
    said = [line for line in lines if SAID in line]
    assert len(said) == 1, lines
    stamp = STAMPED.match(said[0])
    assert stamp and said[0].endswith(SAID), said
    when = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%dT%H:%M:%S.%f")
    assert before - datetime.timedelta(seconds=1) <= when <= after, (before, when, after)
    assert lines[-1].startswith("Processed 0 messages"), lines  # the original's, unstamped


def test_diagnostics_to_the_journal_are_not_stamped_twice(tmp_path):
    lines = stderr_in_file(tmp_path, lambda st: {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert SAID in lines, lines


def test_a_journal_stream_that_is_not_stderr_leaves_the_stamp(tmp_path):
    """JOURNAL_STREAM inherited, stderr redirected elsewhere (a file): stamped."""
    lines = stderr_in_file(tmp_path, lambda st: {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino + 1}"})
    assert any(STAMPED.match(line) and line.endswith(SAID) for line in lines), lines


def test_diagnostics_on_a_terminal_are_not_stamped():
    controller, terminal = pty.openpty()
    try:
        assert run_with_stderr(terminal) == 3
        os.close(terminal)
        terminal = -1
        output = b""
        while True:
            try:
                chunk = os.read(controller, 4096)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            output += chunk
    finally:
        os.close(controller)
        if terminal >= 0:
            os.close(terminal)
    lines = output.decode().splitlines()
    assert SAID in lines, lines


def connection_lines(stderr_lines: list, endpoint: str) -> list:
    return [line for line in stderr_lines if "zmqpush: receiver " in line and endpoint in line]


def test_after_held_back_connection_messages_the_state_now_is_said():
    """A receiver restarted within the 5 s limit: 'connected again' was held
    back; once the spell is over the state now is said, so the last line
    about the endpoint is true."""
    port = free_port()
    receiver = Receiver(port)
    proc = start(["-c", receiver.endpoint])
    lines = []
    try:
        proc.stdin.write(b"first\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 20) == 1
        receiver.stop()
        lines.append(proc.stderr.readline().decode())  # connected
        lines.append(proc.stderr.readline().decode())  # disconnected
        receiver = Receiver(port)
        proc.stdin.write(b"second\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 20) >= 1  # with the replay of "first"
        deadline = time.monotonic() + 20  # the state is said once the spell is over (~5 s)
        while "the state now" not in lines[-1] and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                lines.append(proc.stderr.readline().decode())
    finally:
        proc.stdin.close()
        proc.wait(30)
        lines += proc.stderr.read().decode().splitlines()
        receiver.stop()
        stop_process(proc)
    said = connection_lines(lines, receiver.endpoint)
    assert [line.split("zmqpush: ")[1].split()[1] for line in said] == \
        ["connected", "disconnected", "connected"], lines
    assert "(the state now, 1 such messages held back)" in said[-1], said


def test_a_host_name_that_does_not_resolve_is_named(tmp_path, receiver):
    """The lookup is kept on loopback: the run sees a resolv.conf naming
    127.0.0.1, where no DNS server listens (a mount namespace of its own)."""
    resolv = tmp_path / "resolv.conf"
    resolv.write_text("nameserver 127.0.0.1\n")
    script = 'mount --bind "$0" /etc/resolv.conf && exec "$@"'
    proc = subprocess.Popen(
        ["unshare", "-m", "sh", "-c", script, str(resolv),
         *cli("-c", "tcp://logstash.invalid:2120", "-c", receiver.endpoint)],
        stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    lines = [""]
    try:
        deadline = time.monotonic() + 30
        while "cannot resolve" not in lines[-1] and time.monotonic() < deadline:
            if select.select([proc.stderr], [], [], 0.5)[0]:
                lines.append(proc.stderr.readline().decode())
                assert lines[-1], "zmqpush ended"
        proc.stdin.write(b"".join(b"%d\n" % n for n in range(40)))
        proc.stdin.close()
        assert receiver.wait_for(20, 10) >= 20  # the endpoint that resolves gets its share
        proc.wait(30)
        lines += proc.stderr.read().decode().splitlines()
    finally:
        stop_process(proc)
    assert "Operation not permitted" not in "".join(lines), "unshare -m needs root"
    said = [line for line in lines if "zmqpush: cannot resolve " in line]
    assert len(said) == 1, lines
    assert said[0].rstrip("\n").endswith(
        "zmqpush: cannot resolve logstash.invalid (tcp://logstash.invalid:2120): Temporary "
        "failure in name resolution; retrying every 1 s all the same (said once)"), said
