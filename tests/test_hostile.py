"""Issue 10: what a hostile user can pass in never hangs, crashes or loses lines silently."""
import os
import signal
import subprocess
import time

import pytest

from conftest import cli, env_with, run

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
