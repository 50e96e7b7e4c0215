"""Issue 4: zmqpush as rsyslog's omprog program, against the real rsyslogd."""
import collections
import os
import signal
import time

import pytest
from rsyslog import PrivateRsyslog, available, pid_alive

from conftest import ZMQPUSH, Receiver, closing_count, free_port, run


@pytest.fixture(autouse=True)
def _rsyslogd_installed():
    assert available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"


def binary(*args) -> str:
    """omprog's binary= value: split on spaces by rsyslog, no shell."""
    return " ".join([ZMQPUSH, *args])


def omprog(binary_value: str, workdir, **params) -> str:
    extra = " ".join(f'{k.replace("_", ".")}="{v}"' for k, v in params.items())
    return (f'action(type="omprog" binary="{binary_value}" template="msgonly" '
            f'output="{workdir}/zmqpush.err" {extra})')


def wait_children(rs, timeout=10.0) -> list:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = rs.children()
        if pids:
            return pids
        time.sleep(0.05)
    raise AssertionError("omprog started no program")


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_plain_omprog_ships_20k_messages_with_quotes_tabs_unicode_and_8k_plus(tmp_path):
    receiver = Receiver(free_port())
    rs = PrivateRsyslog(tmp_path, omprog(binary("app", "-c", receiver.endpoint), tmp_path))
    try:
        rs.start()
        big = "B" * 20_000
        messages = [f'n={i} "quoted" tab\there café ✓ back\\slash' for i in range(20_000)]
        messages[100] = big
        rs.send(messages)
        assert receiver.wait_for(20_000, 60) == 20_000
        events = receiver.events()
        assert [e["message"] for e in events] == messages
        assert {e["type"] for e in events} == {"app"}
    finally:
        rs.stop()
        receiver.stop()


def test_force_single_instance_keeps_one_zmqpush_through_a_burst(tmp_path):
    """The README's recommendation: without it this burst starts a second zmqpush
    (a second start-up and connection); with it every line goes through one."""
    receiver = Receiver(free_port())
    rs = PrivateRsyslog(tmp_path, omprog(binary("app", "-c", receiver.endpoint), tmp_path,
                                         forceSingleInstance="on"))
    try:
        rs.start()
        messages = [f"burst {i}" for i in range(100_000)]
        rs.send(messages)
        assert receiver.wait_for(100_000, 60) == 100_000
        events = receiver.events()
        assert len({e["@pid"] for e in events}) == 1
        assert sorted(e["message"] for e in events) == sorted(messages)
    finally:
        rs.stop()
        receiver.stop()


def test_legacy_directive_without_arguments_uses_syslog_and_environment(tmp_path):
    receiver = Receiver(free_port())
    wrapper = tmp_path / "zmqpush-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {ZMQPUSH} "$@"\n')
    wrapper.chmod(0o755)
    rules = (f"$RuleSet ship\n$ActionOMProgBinary {wrapper}\n*.* :omprog:;msgonly\n")
    env = dict(os.environ, ZMQPUSH_CONNECT=receiver.endpoint)
    rs = PrivateRsyslog(tmp_path, rules=rules, env=env)
    try:
        rs.start()
        rs.send(["legacy one", "legacy two"])
        assert receiver.wait_for(2, 30) == 2
        assert [(e["message"], e["type"]) for e in receiver.events()] == [
            ("legacy one", "syslog"), ("legacy two", "syslog")]
    finally:
        rs.stop()
        receiver.stop()


def closing_counts(err: bytes) -> int:
    """Sum of the closing lines: under a burst omprog runs one program per worker."""
    return sum(closing_count(line) for line in err.splitlines() if line.startswith(b"Processed"))


def test_rsyslog_stopped_mid_flow_zmqpush_exits_in_close_timeout_and_delivers_all(tmp_path):
    receiver = Receiver(free_port())
    rs = PrivateRsyslog(tmp_path, omprog(binary("-c", receiver.endpoint), tmp_path))
    try:
        rs.start()
        warmup = [f"warmup {i}" for i in range(10)]
        rs.send(warmup)
        wait_children(rs)
        sent = [f"flow {i}" for i in range(100_000)]
        rs.send(sent)
        receiver.wait_for(20_000, 30)
        pids = rs.children()
        rs.stop()
        assert all(wait_gone(pid, 5.0) for pid in pids), "zmqpush outlived closeTimeout"
        err = (tmp_path / "zmqpush.err").read_bytes()
        assert b"not handed" not in err
        got = receiver.messages()
        assert receiver.settle(0.5) == closing_counts(err)
        assert len(set(got)) == len(got) and set(got) <= set(warmup) | set(sent)
    finally:
        rs.stop()
        receiver.stop()


def test_receiver_down_zmqpush_still_exits_within_close_timeout(tmp_path):
    port = free_port()
    rs = PrivateRsyslog(tmp_path, omprog(binary("-c", f"tcp://127.0.0.1:{port}"), tmp_path))
    try:
        rs.start()
        rs.send([f"doomed {i}" for i in range(3000)])
        (pid,) = wait_children(rs)
        time.sleep(0.5)
        rs.stop()
        assert wait_gone(pid, 5.0), "zmqpush outlived omprog's closeTimeout"
        err = (tmp_path / "zmqpush.err").read_text()
        assert "not handed to ZeroMQ" in err and "Processed " in err
    finally:
        rs.stop()


def test_signal_on_close_term_then_eof_loses_nothing_read(tmp_path):
    receiver = Receiver(free_port())
    rs = PrivateRsyslog(tmp_path, omprog(binary("-c", receiver.endpoint), tmp_path,
                                         signalOnClose="on"))
    try:
        rs.start()
        rs.send([f"m {i}" for i in range(20_000)])
        (pid,) = wait_children(rs)
        receiver.wait_for(5_000, 30)
        rs.stop()
        assert wait_gone(pid, 5.0)
        handed = closing_counts((tmp_path / "zmqpush.err").read_bytes())
        assert receiver.settle(0.5) == handed > 0
    finally:
        rs.stop()
        receiver.stop()


def test_hup_forwarded_as_usr1_prints_counters_and_keeps_running(tmp_path):
    receiver = Receiver(free_port())
    rs = PrivateRsyslog(tmp_path, omprog(binary("-c", receiver.endpoint), tmp_path,
                                         hup_signal="USR1"))
    try:
        rs.start()
        rs.send(["before hup"])
        (pid,) = wait_children(rs)
        assert receiver.wait_for(1, 10) == 1
        os.kill(rs.proc.pid, signal.SIGHUP)
        deadline = time.monotonic() + 10
        err_path = tmp_path / "zmqpush.err"
        while time.monotonic() < deadline and (
                not err_path.exists() or "zmqpush: read=" not in err_path.read_text()):
            time.sleep(0.05)
        assert "zmqpush: read=1 " in err_path.read_text()
        rs.send(["after hup"])
        assert receiver.wait_for(2, 10) == 2
        assert rs.children() == [pid]
    finally:
        rs.stop()
        receiver.stop()


def confirm_rules(binary_value: str, workdir) -> str:
    """The README's confirm-mode configuration: the queue belongs to the ruleset,
    disk-assisted; the action has none of its own (rsyslog 8.2302 loses one message
    when an action with its own queue resumes; see README)."""
    action = omprog(binary_value, workdir, confirmMessages="on",
                    action_resumeRetryCount="-1", action_resumeInterval="1")
    return ('ruleset(name="ship" queue.type="LinkedList" queue.filename="zmqpush-q" '
            f'queue.saveOnShutdown="on") {{\n{action}\n}}')


def test_confirm_mode_receiver_down_first_then_all_5k_delivered(tmp_path):
    port = free_port()
    rules = confirm_rules(binary("--confirm", "-c", f"tcp://127.0.0.1:{port}"), tmp_path)
    rs = PrivateRsyslog(tmp_path, rules=rules)
    receiver = None
    try:
        rs.start()
        messages = [f"confirmed {i}" for i in range(5000)]
        rs.send(messages)
        time.sleep(3)
        receiver = Receiver(port)
        receiver.wait_for(5000, 90)
        receiver.settle(1)
        got = collections.Counter(receiver.messages())
        assert set(got) == set(messages), f"lost {sorted(set(messages) - set(got))[:5]}"
        duplicates = sum(n - 1 for n in got.values())
        assert duplicates <= 2, duplicates  # at most one per instance: the timed-out one
    finally:
        rs.stop()
        if receiver:
            receiver.stop()


def test_confirm_protocol_on_stdout_is_ok_then_one_reply_per_line(receiver):
    proc = run(["--confirm", "-c", receiver.endpoint], b"a\nb\nc\n")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"OK\nOK\nOK\nOK\n"
    assert receiver.wait_for(3) == 3


def test_confirm_refuses_in_bounded_time_when_no_receiver():
    port = free_port()
    began = time.monotonic()
    proc = run(["--confirm", "--confirm-timeout", "0.3", "--linger", "2",
                "-c", f"tcp://127.0.0.1:{port}"], b"x\ny\n", timeout=20)
    # refused lines are rsyslog's to send again: no loss of zmqpush's (README "Confirm mode")
    assert proc.returncode == 0, proc.stderr
    assert b"Refused 2 lines to rsyslog" in proc.stderr
    replies = proc.stdout.decode().splitlines()
    assert replies[0] == "OK"
    assert len(replies) == 3 and not any(r == "OK" for r in replies[1:]), replies
    assert time.monotonic() - began < 10


def test_confirm_refuses_at_once_while_no_receiver_is_connected():
    """rsyslog waits for each reply, its shutdown too: with no receiver nothing
    could turn a wait into "OK", so after the first second (a receiver may still
    connect then) the lines are refused without waiting the --confirm-timeout
    (30 s here), and, being rsyslog's, are no loss (exit 0)."""
    port = free_port()
    proc = run(["--confirm", "--confirm-timeout", "30", "--linger", "3",
                "-c", f"tcp://127.0.0.1:{port}"], b"x\ny\nz\n", timeout=20)
    replies = proc.stdout.decode().splitlines()
    assert replies[0] == "OK" and len(replies) == 4, replies
    assert not any(r == "OK" for r in replies[1:]), replies
    assert proc.returncode == 0, proc.stderr
    assert b"Refused 3 lines to rsyslog" in proc.stderr
