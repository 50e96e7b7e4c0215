"""Issue 36: --stdout writes every event zmqpush would send, one JSON document a
line, with no socket: the same events a real receiver gets, every input mode,
the socket options refused, a closed stdout, and a reader of stdout that pauses."""
import json
import os
import subprocess
import threading
import time

import pytest

from conftest import Receiver, cli, free_port, run, start, stop_process, vm_peak_rss_kib, wait_until

JOURNAL_ENTRY = {"MESSAGE": "unit started", "PRIORITY": "6", "SYSLOG_IDENTIFIER": "app",
                 "_PID": "42", "_HOSTNAME": "h1", "__CURSOR": "s=1;i=2",
                 "__REALTIME_TIMESTAMP": "1700000000123456"}
STACK = (b"Traceback (most recent call last):\n"
         b'  File "a.py", line 1, in <module>\n'
         b"ValueError: boom\n"
         b"next line\n")
# (arguments, stdin): each input mode.
MODES = {
    "plain": (["app", "-f", "dc=eu1", "--timestamp"], b"one\n\xff two\n"),
    "batch": (["app", "--batch"], b"a\nb\nc\n"),
    "json": (["app", "--json", "--host-field"], b'{"level":"info","n":1}\nnot json\n'),
    "journal": (["journal", "--journal"], json.dumps(JOURNAL_ENTRY).encode() + b"\n"),
    "multiline": (["app", "--multiline", "python"], STACK),
}


def without_volatile(doc):
    """doc without what differs between two runs (@pid, @timestamp)."""
    if isinstance(doc, list):
        return [without_volatile(item) for item in doc]
    return {k: v for k, v in doc.items() if k not in ("@pid", "@timestamp")}


def sent_documents(args: list, data: bytes) -> list:
    """The documents a real receiver gets from a run on data (one per message)."""
    receiver = Receiver(free_port())
    try:
        proc = run([*args, "-c", receiver.endpoint], data)
        assert proc.returncode == 0, proc.stderr
        receiver.settle(0.3)
        return [json.loads(frame) for frame in receiver.frames]
    finally:
        receiver.stop()


@pytest.mark.parametrize("mode", MODES)
def test_stdout_writes_what_a_receiver_gets(mode):
    args, data = MODES[mode]
    proc = run([*args, "--stdout"], data)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith(b"\n")
    written = [json.loads(line) for line in proc.stdout.decode().splitlines()]
    assert written, proc.stderr
    assert [without_volatile(d) for d in written] == \
        [without_volatile(d) for d in sent_documents(args, data)]
    assert b"Processed " in proc.stderr and b"receiver" not in proc.stderr


@pytest.mark.parametrize("option", [
    ["-c", "tcp://127.0.0.1:9"], ["--bind", "tcp://127.0.0.1:9"], ["--heartbeat", "5"],
    ["--curve-server-cert", "server.key"], ["--allow", "10.0.0.0/8"], ["--confirm"],
    ["--spool", "spool"]])
def test_stdout_refuses_what_needs_a_socket(option, tmp_path):
    proc = subprocess.run(cli("--stdout", *option), input=b"x\n",
                          capture_output=True, timeout=30, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == b""
    lines = proc.stderr.decode().splitlines()
    assert len(lines) == 1 and "zmqpush: --stdout and " in lines[0], lines
    assert "cannot be combined" in lines[0] and option[0] in lines[0]
    assert not os.path.exists(tmp_path / "spool")


def test_stdout_closed_by_its_reader_ends_the_run(tmp_path):
    """A reader that takes one line and goes: the run ends as at end of input,
    with one line and exit 3, not a traceback."""
    reader = subprocess.Popen(["head", "-n", "1"], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE)
    proc = start(["app", "--stdout"], stdout=reader.stdin)
    reader.stdin.close()
    chunk = b"".join(b"%d\n" % n for n in range(1000))
    try:
        proc.stdin.write(chunk)
        proc.stdin.flush()
        first = reader.stdout.readline()
        assert json.loads(first)["message"] == "0"
        assert reader.wait(30) == 0
        fed = 0
        try:  # stdin stays open: only the closed stdout can end the run
            while proc.poll() is None and fed < 1000:
                proc.stdin.write(chunk)
                proc.stdin.flush()
                fed += 1
        except BrokenPipeError:
            pass
        assert proc.wait(30) == 3
        err = proc.stderr.read().decode()
        assert "zmqpush: stdout was closed by its reader: " in err, err
        assert "Traceback" not in err and "Processed " in err
    finally:
        stop_process(proc)
        stop_process(reader)


def zmq_threads(pid: int) -> list:
    """Names of the process's threads that libzmq started."""
    names = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{task}/comm") as f:
                names.append(f.read().strip())
        except FileNotFoundError:
            pass
    return [name for name in names if name.startswith("ZMQbg")]


def test_stdout_reader_that_pauses_holds_input_back_in_bounded_memory():
    """stdout a pipe nobody reads for a while: the input waits (backpressure),
    memory stays bounded, no ZeroMQ thread runs; once read, every line comes
    in order and the run ends with 0."""
    lines = 400_000
    line = b"x" * 100
    proc = start(["app", "--stdout"])
    fed = threading.Event()

    def feed():
        try:
            for n in range(0, lines, 1000):
                proc.stdin.write(b"".join(b"%d %s\n" % (m, line) for m in range(n, n + 1000)))
            proc.stdin.close()
            fed.set()
        except BrokenPipeError:
            pass

    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    try:
        time.sleep(2)
        assert not fed.is_set(), "the input was not held back by the paused reader"
        assert zmq_threads(proc.pid) == []
        assert vm_peak_rss_kib(proc.pid) < 64 << 10
        out = proc.stdout.read()
        assert proc.wait(60) == 0, proc.stderr.read()
        assert fed.is_set()
        got = out.splitlines()
        assert len(got) == lines
        assert all(json.loads(text)["message"] == f"{n} {line.decode()}"
                   for n, text in enumerate(got))
    finally:
        stop_process(proc)
        feeder.join(10)
    assert wait_until(lambda: proc.poll() is not None, 5)
