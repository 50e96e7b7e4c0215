"""Issue 10: what a hostile user can pass in never hangs, crashes or loses lines silently."""
import os
import signal
import subprocess
import time

from conftest import cli, env_with

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
