"""--multiline with --confirm (issue 27): rsyslog sends a line only once the one
before it is answered, so a line the joiner holds is answered "OK" at once, in
order with every other reply; the event it joins leaves later, never refused
(without --spool: written into the socket's buffer; with it: spooled).

An omprog-like driver (one line written, one reply read, as rsyslog does) and
real rsyslogd in the README's confirm mode, with the installed CLI and real
PULL receivers on 127.0.0.1."""
from __future__ import annotations

import json
import os
import select
import signal
import sys
import time

import pytest
from rsyslog import PrivateRsyslog, available
from test_confirm_restart import confirm_ruleset
from test_multiline import interleaved, stderr_of
from test_rsyslog import binary

from conftest import Receiver, free_port, run, start, stop_process, wait_until

REFUSAL = "zmqpush: not accepted by ZeroMQ in time"
TRACE = ["Traceback (most recent call last):", '  File "app.py", line 3, in main',
         "    run()", "ValueError: bad value"]
GO_PANIC = ["panic: boom", "", "goroutine 1 [running]:", "main.main()",
            "\t/src/main.go:8 +0x1d", "", "goroutine 5 [chan receive]:", "main.worker()",
            "\t/src/main.go:4 +0x2a"]


class Driver:
    """zmqpush --confirm driven as omprog drives it: the first reply is read at
    start, then say() writes one line and reads its one reply."""

    def __init__(self, endpoint: str, *args):
        self.proc = start(["--confirm", "-c", endpoint, *args], bufsize=0)
        self._read = b""
        assert self.reply() == "OK"

    def reply(self, timeout: float = 10.0) -> str:
        """The next reply line; fails if none comes within timeout (a stall)."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self._read:
            ready, _, _ = select.select([self.proc.stdout], [], [],
                                        max(0.0, deadline - time.monotonic()))
            assert ready, "no reply: zmqpush stalled"
            data = os.read(self.proc.stdout.fileno(), 4096)
            assert data, "zmqpush closed stdout"
            self._read += data
        line, self._read = self._read.split(b"\n", 1)
        return line.decode()

    def say(self, line: str) -> str:
        self.proc.stdin.write(line.encode() + b"\n")
        self.proc.stdin.flush()
        return self.reply()

    def end(self, how: str = "eof", timeout: float = 30.0) -> tuple:
        """End with EOF or SIGTERM; (exit code, more stdout, stderr)."""
        if how == "sigterm":
            self.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)  # before communicate() closes stdin
        out, err = self.proc.communicate(timeout=timeout)
        return self.proc.returncode, (self._read + out).decode(), err.decode()


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_one_reply_a_line_at_once_and_the_traces_arrive_joined(tmp_path, spool):
    """Each line gets its reply before the next is written (a held line too:
    rsyslog would otherwise wait for ever); a Python trace and a Go panic
    (blank lines held until the next line decides) arrive as one event each,
    the lines around them as their own."""
    receiver = Receiver(free_port())
    more = ["--spool", str(tmp_path / "spool")] if spool else []
    driver = Driver(receiver.endpoint, "--multiline", "python,go",
                    "--multiline-timeout", "600", *more)
    lines = ["before", *TRACE, "1 between", *GO_PANIC, "2 after"]
    try:
        assert [driver.say(line) for line in lines] == ["OK"] * len(lines)
        code, out, err = driver.end()
        assert (code, out) == (0, ""), err
        receiver.settle()
        assert receiver.messages() == ["before", "\n".join(TRACE), "1 between",
                                       "\n".join(GO_PANIC), "2 after"]
        assert "Joined 13 lines into 2 multi-line events" in err
    finally:
        stop_process(driver.proc)
        receiver.stop()


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_per_source_json_lines_one_reply_each_and_traces_joined(tmp_path, spool):
    """--json --multiline with --confirm: two sources' traces interleaved line
    by line; each line is answered before the next is written, and each trace
    arrives as one event (its first line's object, messages joined), the
    lines around them as their own."""
    receiver = Receiver(free_port())
    more = ["--spool", str(tmp_path / "spool")] if spool else []
    driver = Driver(receiver.endpoint, "--json", "--multiline", "python",
                    "--multiline-source", "app", "--multiline-timeout", "600", *more)

    def line(app: str, message: str) -> str:
        return json.dumps({"app": app, "message": message})
    lines = [line("a", "before")]
    for text in TRACE:
        lines += [line("a", text), line("b", text)]
    lines += [line("a", "1 after a"), "not json", line("b", "1 after b")]
    try:
        assert [driver.say(text) for text in lines] == ["OK"] * len(lines)
        code, out, err = driver.end()
        assert (code, out) == (0, ""), err
        receiver.settle()
        trace = "\n".join(TRACE)
        assert receiver.messages() == ["before", trace, "1 after a", "not json", trace,
                                       "1 after b"]
        assert [event.get("app") for event in receiver.events()] == [
            "a", "a", "a", None, "b", "b"]
        assert "Joined 8 lines into 2 multi-line events" in err
    finally:
        stop_process(driver.proc)
        receiver.stop()


def test_replies_keep_the_order_of_the_lines_refused_or_held(tmp_path):
    """No receiver (after the first second a line ZeroMQ cannot take is
    refused at once): in one write, the plain line is refused and the held
    trace lines are answered "OK" after it, in the lines' order.  The trace,
    answered and never handed, is counted lost: exit 3."""
    driver = Driver(f"tcp://127.0.0.1:{free_port()}", "--multiline", "python",
                    "--multiline-timeout", "600", "--linger", "0.5")
    try:
        time.sleep(1.3)
        driver.proc.stdin.write(b"plain\n" + "\n".join(TRACE[:3]).encode() + b"\n")
        driver.proc.stdin.flush()
        assert [driver.reply() for _ in range(4)] == [REFUSAL, "OK", "OK", "OK"]
        code, out, err = driver.end()
        assert code == 3 and out == "", err
        assert "1 messages whose lines were answered \"OK\" to rsyslog (--multiline) " \
               "were not handed to ZeroMQ within --linger 0.5s: lost" in err
        assert "Refused 1 lines to rsyslog" in err
    finally:
        stop_process(driver.proc)


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
@pytest.mark.parametrize("receiver_up", [True, False], ids=["receiver-up", "receiver-down"])
def test_sigterm_while_an_event_is_pending(tmp_path, spool, receiver_up):
    """SIGTERM ends the pending event first: it arrives; with the receiver gone
    it is counted lost (exit 3) without a spool, and kept in the spool (exit 3,
    the next run sends it) with one."""
    port = free_port()
    receiver = Receiver(port)
    spool_dir = str(tmp_path / "spool")
    more = ["--spool", spool_dir] if spool else []
    driver = Driver(receiver.endpoint, "--multiline", "python", "--multiline-timeout", "600",
                    "--linger", "1", *more)
    try:
        assert driver.say("before") == "OK"
        assert receiver.wait_for(1, 10) == 1
        assert [driver.say(line) for line in TRACE] == ["OK"] * len(TRACE)
        if not receiver_up:
            receiver.stop()
            time.sleep(1)  # zmqpush sees the disconnection
        code, out, err = driver.end("sigterm")
        assert out == ""
        if receiver_up:
            assert code == 0, err
            receiver.settle()
            assert receiver.messages() == ["before", "\n".join(TRACE)]
            return
        assert code == 3, err
        if not spool:
            assert "1 messages whose lines were answered \"OK\"" in err and ": lost" in err
            return
        assert "stay in the spool" in err and "lost" not in err
        receiver = Receiver(port)
        again = run(["-q", "-c", receiver.endpoint, "--spool", spool_dir], b"")
        assert again.returncode == 0, again.stderr
        receiver.settle()  # "before" again too: the spool's replay window
        assert receiver.messages()[-1] == "\n".join(TRACE)
        assert set(receiver.messages()) <= {"before", "\n".join(TRACE)}
    finally:
        stop_process(driver.proc)
        receiver.stop()


def test_receiver_gone_while_a_trace_is_held_then_back(tmp_path):
    """The receiver goes away while a trace is held: the line that ends the
    trace is refused (no receiver), the trace waits in zmqpush, and while it
    waits no new line is taken (refused, so rsyslog keeps it: what zmqpush
    answered and holds stays one event); the receiver back, the trace arrives
    joined and lines are taken again.  Nothing lost."""
    port = free_port()
    receiver = Receiver(port)
    driver = Driver(receiver.endpoint, "--multiline", "python", "--multiline-timeout", "600")
    try:
        assert driver.say("before") == "OK"
        assert receiver.wait_for(1, 10) == 1
        assert [driver.say(line) for line in TRACE] == ["OK"] * len(TRACE)
        receiver.stop()
        time.sleep(1)  # zmqpush sees the disconnection
        assert driver.say("1 after") == REFUSAL  # the trace leaves and waits
        assert driver.say(TRACE[0]) == REFUSAL  # not held while it waits
        receiver = Receiver(port)
        assert receiver.wait_for(1, 10) == 1
        deadline = time.monotonic() + 10
        while driver.say("1 after") != "OK":  # as rsyslog sends a refused line again
            assert time.monotonic() < deadline
            time.sleep(0.2)
        code, out, err = driver.end()
        assert (code, out) == (0, ""), err
        receiver.settle()  # "before" again too: the replay window
        assert [m for m in receiver.messages() if m != "before"] == ["\n".join(TRACE), "1 after"]
    finally:
        stop_process(driver.proc)
        receiver.stop()


@pytest.fixture
def rsyslogd_installed():
    assert available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"


def imfile_rsyslog(tmp_path, *args) -> tuple:
    """rsyslogd following tmp_path/app.log with imfile into the README's
    confirm-mode ruleset running zmqpush --confirm with args; (rsyslogd, log)."""
    log = tmp_path / "app.log"
    log.touch()
    rules = (confirm_ruleset("zq", binary("app", "--confirm", *args), tmp_path)
             + f'input(type="imfile" File="{log}" Tag="app" ruleset="zq")\n')
    return PrivateRsyslog(tmp_path, rules=rules,
                          modules='module(load="omprog")\nmodule(load="imfile")'), log


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_rsyslog_imfile_trace_is_one_event_and_rsyslog_never_stalls(
        tmp_path, rsyslogd_installed, spool):
    """A real traceback written into a file imfile follows reaches the receiver
    as one event, the lines around it as their own, and the lines written
    after it keep coming: each line got its reply (one zmqpush ran, it was not
    restarted for a missing or extra reply).  (imfile drops blank lines: a
    chained traceback's blank line before "During handling..." never comes.)"""
    program = tmp_path / "fails.py"
    program.write_text("def inner():\n    return {}['missing']\n"
                       "def outer():\n    inner()\nouter()\n")
    data, expected = interleaved([stderr_of([sys.executable, str(program)], tmp_path)])
    receiver = Receiver(free_port())
    more = ["--spool", str(tmp_path / "spool")] if spool else []
    rs, log = imfile_rsyslog(tmp_path, "--multiline", "python", "-c", receiver.endpoint,
                             *more)
    later = [f"later {n}" for n in range(50)]
    try:
        rs.start()
        with open(log, "ab") as f:
            f.write(data)
            f.flush()
            time.sleep(0.5)
            f.write("".join(line + "\n" for line in later).encode())
        assert receiver.wait_for(len(expected) + len(later), 30) >= len(expected) + len(later)
        receiver.settle()
        assert receiver.messages() == expected + later
        assert len({e["@pid"] for e in receiver.events()}) == 1
    finally:
        rs.stop()
        receiver.stop()
    err = (tmp_path / "zq.err").read_text()
    assert err.count("Processed ") == 1 and "Traceback" not in err, err


def test_rsyslog_receiver_gone_while_a_trace_is_held_then_back(tmp_path, rsyslogd_installed):
    """Under rsyslogd: the receiver goes away while a trace is held; the lines
    after it are refused and sent again by rsyslog; the receiver back, the
    trace arrives joined and every line after it too, once each."""
    port = free_port()
    receiver = Receiver(port)
    rs, log = imfile_rsyslog(tmp_path, "--multiline", "python", "--multiline-timeout", "600",
                             "-c", receiver.endpoint)
    after = [f"{n} after" for n in range(20)]
    try:
        rs.start()
        with open(log, "a") as f:
            f.write("before\n" + "".join(line + "\n" for line in TRACE))
        assert receiver.wait_for(1, 20) == 1
        time.sleep(1)  # the trace is held
        receiver.stop()
        time.sleep(1)
        with open(log, "a") as f:
            f.write("".join(line + "\n" for line in after))
        time.sleep(3)  # rsyslog sends the refused line again, and again
        receiver = Receiver(port)
        receiver.wait_for(2 + len(after), 40)
        receiver.settle(1)  # and "before" again if the replay window still held it
        assert [m for m in receiver.messages() if m != "before"] == ["\n".join(TRACE), *after]
    finally:
        rs.stop()
        receiver.stop()
    err = (tmp_path / "zq.err").read_text()
    assert err.count("Processed ") == 1 and "Refused " in err, err


def held_file(spool) -> bytes:
    """What the spool's file `held` holds now (b"" when there is none)."""
    try:
        return (spool / "held").read_bytes()
    except FileNotFoundError:
        return b""


def test_rsyslog_json_spool_sigkill_mid_event_loses_no_line_answered(tmp_path,
                                                                     rsyslogd_installed):
    """--confirm --multiline --json --spool under rsyslogd: zmqpush is SIGKILLed
    while the first lines of a trace are answered "OK" and held; omprog starts
    it again, it takes the held lines back from the spool (file `held`), the
    rest of the trace joins them, and the trace arrives whole as one event,
    the lines around it once each (the spool's replay window may send
    "before" again)."""
    from test_spool_rsyslog import wait_child, zmqpush_child
    receiver = Receiver(free_port())
    spool = tmp_path / "spool"
    rs, log = imfile_rsyslog(tmp_path, "--json", "--multiline", "python",
                             "--multiline-timeout", "600", "--spool", str(spool),
                             "-c", receiver.endpoint)

    def write(*messages: str):
        with open(log, "a") as f:
            f.write("".join(json.dumps({"app": "a", "message": m}) + "\n" for m in messages))
    try:
        rs.start()
        write("before", *TRACE[:3])
        assert receiver.wait_for(1, 20) == 1
        assert wait_until(lambda: TRACE[2].encode() in held_file(spool), 20)
        time.sleep(1)  # its "OK" written after the file (a kill before it: sent again)
        first = zmqpush_child(rs)
        os.kill(first, signal.SIGKILL)
        write(TRACE[3], "1 after")  # omprog starts zmqpush again for these
        receiver.wait_for(3, 30)
        receiver.settle(1)
        assert [m for m in receiver.messages() if m != "before"] == ["\n".join(TRACE), "1 after"]
        assert {e["app"] for e in receiver.events()} == {"a"}
        assert wait_child(rs, 5) not in (None, first)
    finally:
        rs.stop()
        receiver.stop()


def container_trace(runtime: str) -> list:
    """A Python trace as container log lines of stream stderr: its second line
    in two partial entries (Docker: a "log" without newline; CRI: tag P)."""
    pieces = [(TRACE[0], True), (TRACE[1][:9], False), (TRACE[1][9:], True),
              *((line, True) for line in TRACE[2:])]
    when = "2026-11-27T10:00:00.1Z"
    if runtime == "--docker":
        return [json.dumps({"log": text + ("\n" if whole else ""), "stream": "stderr",
                            "time": when}) for text, whole in pieces]
    return [f"{when} stderr {'F' if whole else 'P'} {text}" for text, whole in pieces]


@pytest.mark.parametrize("runtime", ["--docker", "--cri"])
def test_container_spool_sigkill_mid_trace_rejoins_the_trace(tmp_path, runtime):
    """--confirm --spool --docker|--cri --multiline: SIGKILLed while the
    joining stage holds the trace's first line and the container stage the
    first piece of its second, the next run takes each back into the stage
    that held it: the trace arrives whole, as one event of stream stderr."""
    receiver = Receiver(free_port())
    spool = tmp_path / "spool"
    lines = container_trace(runtime)
    args = (runtime, "--multiline", "python", "--multiline-timeout", "600",
            "--spool", str(spool))
    driver = Driver(receiver.endpoint, *args)
    try:
        assert [driver.say(line) for line in lines[:2]] == ["OK"] * 2
        assert wait_until(lambda: lines[1].encode() in held_file(spool), 10)
        driver.proc.kill()
        driver.proc.wait(10)
        driver = Driver(receiver.endpoint, *args)
        assert [driver.say(line) for line in lines[2:]] == ["OK"] * len(lines[2:])
        code, out, err = driver.end()
        assert (code, out) == (0, ""), err
        receiver.settle()
        assert [(e["message"], e["stream"]) for e in receiver.events()] == [
            ("\n".join(TRACE), "stderr")], err
        assert "_jsonparsefailure" not in json.dumps(receiver.events())
        assert held_file(spool) == b""
    finally:
        stop_process(driver.proc)
        receiver.stop()


def test_spool_without_confirm_sigkill_mid_trace_loses_no_line(tmp_path):
    """--spool --multiline without --confirm: the lines of a pending trace are
    kept in the spool (file `held`) once read; SIGKILLed, the next run takes
    them back and the rest of the trace joins them; once nothing is held the
    file is gone."""
    receiver = Receiver(free_port())
    spool = tmp_path / "spool"
    args = ["-c", receiver.endpoint, "--multiline", "python", "--multiline-timeout", "600",
            "--spool", str(spool)]
    first = start(args)
    try:
        first.stdin.write(("before\n" + "\n".join(TRACE[:2]) + "\n").encode())
        first.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        assert wait_until(lambda: TRACE[1].encode() in held_file(spool), 10)
        first.kill()
        first.wait(10)
        again = run(args, ("\n".join([*TRACE[2:], "1 after"]) + "\n").encode())
        assert again.returncode == 0, again.stderr
        receiver.settle()
        assert [m for m in receiver.messages() if m != "before"] == ["\n".join(TRACE), "1 after"]
        assert held_file(spool) == b""
    finally:
        stop_process(first)
        receiver.stop()
