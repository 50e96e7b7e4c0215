"""Issue 27, per source: --multiline with --json and --journal joins each line's
message only with lines of the same source (--multiline-source's keys; journald's
host, unit and pid by default), and lines that are not JSON objects among
themselves.  Real Python tracebacks, real journal files (systemd-journal-remote,
journalctl), the installed CLI and real PULL sockets on 127.0.0.1."""
import json
import os
import signal
import subprocess
import time

import pytest
from test_multiline import java_traces, python_traces
from test_shipping import wakeups_once_settled
from test_structured import BOOT_ID, JOURNAL_REMOTE, export_entry, journalctl

import zmqpush
from conftest import Receiver, free_port, run, start, stop_process

RSYSLOG_KEYS = "logsource,program,pid"  # README's jsonf template
PROGRAMS = {"a": ("web1", "11"), "b": ("web1", "22")}


def ship(receiver: Receiver, data: bytes, *args, env=None):
    proc = run(["app", "-q", "-c", receiver.endpoint, *args], data, env=env)
    assert proc.returncode == 0, proc.stderr
    receiver.settle()
    return proc


def alone(text: bytes, presets: str = "python") -> list:
    """The messages --multiline makes of text without --json: what one program's
    lines must become when joined apart from every other source's."""
    receiver = Receiver(free_port())
    try:
        ship(receiver, text, "--multiline", presets)
        return receiver.messages()
    finally:
        receiver.stop()


def first_lines(messages: list) -> list:
    """The index of each message's first line among all the lines."""
    out, at = [], 0
    for message in messages:
        out.append(at)
        at += message.count("\n") + 1
    return out


def alternate(*sequences) -> list:
    """One item of each in turn, while any is left."""
    out = []
    for n in range(max(map(len, sequences))):
        out += [seq[n] for seq in sequences if n < len(seq)]
    return out


def rsyslog_lines(program: str, text: bytes) -> list:
    """text's lines as rsyslog's jsonf template writes them for program."""
    host, pid = PROGRAMS[program]
    return [json.dumps({"@timestamp": "2026-11-25T12:00:00Z", "logsource": host,
                        "program": program, "pid": pid, "severity": "err", "seq": n,
                        "message": line}).encode()
            for n, line in enumerate(text.decode().splitlines())]


@pytest.mark.parametrize("keys", [RSYSLOG_KEYS, "program"])
def test_two_programs_tracebacks_interleaved_line_by_line_join_apart(receiver, tmp_path,
                                                                      keys):
    chained, group = python_traces(tmp_path)[:2]
    texts = {"a": chained, "b": group}
    data = b"".join(line + b"\n" for line in alternate(
        *(rsyslog_lines(name, text) for name, text in texts.items())))
    proc = ship(receiver, data, "--json", "--multiline", "python", "--multiline-source", keys)
    events = receiver.events()
    for name, text in texts.items():
        expected = alone(text)
        assert any("\n" in m for m in expected)
        mine = [e for e in events if e["program"] == name]
        assert [e["message"] for e in mine] == expected
        # the first line's fields, the message aside; the other lines' are dropped
        assert [e["seq"] for e in mine] == first_lines(expected)
        assert all((e["logsource"], e["pid"], e["severity"], e["type"])
                   == (*PROGRAMS[name], "err", "app") for e in mine)
    assert len(events) == sum(len(alone(text)) for text in texts.values())
    joined = sum("\n" in e["message"] for e in events)
    assert f"into {joined} multi-line events (0 cut at a cap)" in proc.stderr.decode()


def test_a_java_trace_is_joined_though_another_program_s_lines_come_between(receiver,
                                                                          tmp_path):
    """Java's head line is joined by the frames after it: here each comes
    after a line of the other program."""
    (java,) = java_traces(tmp_path)
    python = python_traces(tmp_path)[0]
    data = b"".join(line + b"\n" for line in alternate(rsyslog_lines("a", java),
                                                       rsyslog_lines("b", python)))
    ship(receiver, data, "--json", "--multiline", "python,java", "--multiline-source", "program")
    events = receiver.events()
    for name, text in (("a", java), ("b", python)):
        assert [e["message"] for e in events if e["program"] == name] == alone(
            text, "python,java")


def test_the_message_key_is_what_is_joined(receiver, tmp_path):
    chained, group = python_traces(tmp_path)[:2]
    texts = {"a": chained, "b": group}
    data = b"".join(json.dumps({"prog": name, "msg": line}).encode() + b"\n"
                    for name, line in alternate(*([(name, line) for line in
                                                   text.decode().splitlines()]
                                                  for name, text in texts.items())))
    ship(receiver, data, "--json", "--json-message-key", "msg", "--multiline", "python",
         "--multiline-source", "prog")
    events = receiver.events()
    for name, text in texts.items():
        assert [e["message"] for e in events if e["prog"] == name] == alone(text)
    assert not any("msg" in e for e in events)


# ------------------------------------------------------------------ journald --
JOURNAL_SOURCES = [("a.service", b"11"), ("a.service", b"12"), ("b.service", b"21")]
FIRST_MICROS = 1764072000000000


def journal_of(tmp_path, texts: list) -> str:
    """A real journal file, written by systemd-journal-remote: the lines of
    texts[i] logged by JOURNAL_SOURCES[i], interleaved line by line."""
    if not os.path.exists(JOURNAL_REMOTE):
        pytest.fail(f"{JOURNAL_REMOTE} is missing: .ci/run installs systemd-journal-remote")
    entries = alternate(*([(unit, pid, line) for line in text.splitlines()]
                          for (unit, pid), text in zip(JOURNAL_SOURCES, texts)))
    data = b"".join(export_entry([
        (b"__REALTIME_TIMESTAMP", b"%d" % (FIRST_MICROS + n * 1001)),
        (b"__MONOTONIC_TIMESTAMP", b"%d" % (1000 + n)), (b"_BOOT_ID", BOOT_ID.encode()),
        (b"MESSAGE", line), (b"PRIORITY", b"3"), (b"SYSLOG_IDENTIFIER", b"app"),
        (b"_PID", pid), (b"_HOSTNAME", b"web1"), (b"_SYSTEMD_UNIT", unit.encode())])
        for n, (unit, pid, line) in enumerate(entries))
    path = str(tmp_path / "sources.journal")
    subprocess.run([JOURNAL_REMOTE, "-o", path, "-"], input=data, check=True,
                   capture_output=True, timeout=30)
    return path


def test_journalctl_of_two_units_and_pids_interleaved(tmp_path, receiver):
    traces = python_traces(tmp_path)
    texts = [traces[0], traces[1], traces[3]]
    path = journal_of(tmp_path, texts)
    entries = [json.loads(line) for line in journalctl(path, "--all").splitlines()]
    ship(receiver, journalctl(path, "--all"), "--journal", "--multiline", "python")
    events = receiver.events()
    for (unit, pid), text in zip(JOURNAL_SOURCES, texts):
        mine = [e for e in events if (e["unit"], e["pid"]) == (unit, int(pid))]
        expected = alone(text)
        assert [e["message"] for e in mine] == expected
        theirs = [e for e in entries if (e["_SYSTEMD_UNIT"], e["_PID"]) == (unit, pid.decode())]
        firsts = [theirs[n] for n in first_lines(expected)]
        assert [e["@metadata"]["_id"] for e in mine] == [e["__CURSOR"] for e in firsts]
        assert all(e["logsource"] == "web1" and e["severity"] == 3 for e in mine)
    assert len(events) == sum(len(alone(text)) for text in texts)


# ------------------------------------------------------------ text among JSON --
def test_a_raw_traceback_among_json_lines_is_joined_as_text(receiver, tmp_path):
    """A traceback printed raw between JSON log lines (each line between two
    JSON ones) is one event, sent as any line that is not JSON; the JSON lines
    are their own events, as --json alone sends them."""
    trace = python_traces(tmp_path)[0]
    logs = [b'{"level":"info","message":"request %d"}' % n for n in range(40)]
    data = b"".join(line + b"\n" for line in alternate(trace.splitlines(), logs))
    proc = ship(receiver, data, "--json", "--multiline", "python", "-f", "dc=eu1")
    events = receiver.events()
    texts = [e for e in events if "tags" in e]
    assert [e["message"] for e in texts] == alone(trace)
    assert all(e["tags"] == ["_jsonparsefailure"] and e["@json_error"] == "not JSON"
               and e["dc"] == "eu1" for e in texts)
    json_frames = [f for f in without_pid(receiver.frames, proc) if b"_jsonparsefailure" not in f]
    assert json_frames == json_alone(b"".join(line + b"\n" for line in logs))


# ------------------------------------------------------ one line, as --json --
def json_alone(data: bytes, *args) -> list:
    """The frames --json (or --journal, in args) alone sends for data, the pid
    replaced by PID."""
    receiver = Receiver(free_port())
    try:
        proc = ship(receiver, data, *(args or ["--json"]), "-f", "dc=eu1")
        return without_pid(receiver.frames, proc)
    finally:
        receiver.stop()


def without_pid(frames: list, proc) -> list:
    pid = int(proc.stderr.decode().rsplit("@pid:", 1)[1].split(".")[0].split()[0]) \
        if b"@pid:" in proc.stderr else None
    return [f.replace(b'"@pid":%d' % pid, b'"@pid":PID') if pid else f for f in frames]


ONE_LINE_EVENTS = [
    b'{"b": 1.50, "a" : [1 ,2], "message":"caf\\u00e9 \\"q\\""}',
    b' \t{"program":"x","message":"spaced","n":1e400}  ',
    b'{"program":"x","message":"Traceback (most recent call last):"}',  # begins, then ends
    b'{"program":"x","message":"Traceback (most recent call last):"}',
    b'{"program":"x","message":""}',
    b'{"@timestamp":"yesterday","tags":"one","message":"reserved keys"}',
    b'{"type":"theirs","message":"collides","@metadata":{"k":1}}',
    b'{"program":"x","message":["not","a","string"]}',
    b'{"program":"x"}',
    b'{"message":"\\ud800 lone"}',
    b"plain text",
    b"[1,2]",
    b"bad \xff utf-8",
    b'{"message":"crlf"}\r',
    b"",
]


@pytest.mark.parametrize("mode", [["--json"], ["--json", "--json-target", "log"],
                                  ["--json", "--json-overwrite", "--batch"]],
                         ids=["root", "target", "overwrite-batch"])
def test_a_one_line_event_is_byte_identical_to_json_alone(receiver, mode):
    data = b"".join(line + b"\n" for line in ONE_LINE_EVENTS)
    proc = ship(receiver, data, *mode, "-f", "dc=eu1", "--multiline", "python,java,go,ruby",
                "--multiline-source", "program")
    assert without_pid(receiver.frames, proc) == json_alone(data, *mode)
    assert "Joined 0 lines into 0 multi-line events" in proc.stderr.decode()


def test_a_one_line_journal_event_is_byte_identical_to_journal_alone(tmp_path, receiver):
    """Byte for byte, though not in the same order: a line that began an event
    the next line of its source ended leaves after the lines between."""
    path = journal_of(tmp_path, [b"first\nTraceback (most recent call last):\n\nplain",
                                 b"other\n  indented", b"x"])  # indented: another pid's
    data = journalctl(path, "--all")
    proc = ship(receiver, data, "--journal", "-f", "dc=eu1", "--multiline", "python")
    assert sorted(without_pid(receiver.frames, proc)) == sorted(json_alone(data, "--journal"))
    assert len(receiver.frames) == 7
    assert "Joined 0 lines into 0 multi-line events" in proc.stderr.decode()


# ------------------------------------------------------- caps and bounds --
def numbered_traces(names: list, frames: int, width: int = 0) -> list:
    """For each name, a trace of a head and indented frames (pattern ^\\s
    joins them), as JSON lines; interleaved line by line."""
    pad = "x" * width
    return alternate(*([json.dumps({"src": name, "n": n, "message": (
        f"head {name}" if n == 0 else f"  frame {name} {n} {pad}")}).encode()
        for n in range(frames + 1)] for name in names))


def by_source(events: list) -> dict:
    out: dict = {}
    for e in events:
        out.setdefault(e["src"], []).append(e)
    return out


def test_values_python_holds_equal_are_sources_apart(receiver):
    """pid 1, true and 1.0 (and 0.0, -0.0) are equal to Python, not to the sender."""
    pids = ["1", "true", "1.0", "0.0", "-0.0"]
    trace = ["Traceback (most recent call last):", '  File "x.py", line 1, in f',
             "ValueError: {}"]
    data = b"".join(
        b'{"pid":%s,"message":%s}\n' % (pid.encode(), json.dumps(line.format(pid)).encode())
        for line in trace for pid in pids)
    ship(receiver, data, "--json", "--multiline", "python", "--multiline-source", "pid")
    messages = sorted(receiver.messages())
    assert messages == sorted("\n".join(trace).format(pid) for pid in pids)


def test_an_event_that_leaves_line_by_line_is_not_counted_as_joined(receiver):
    """A lone surrogate in a message: the first object cannot be written again,
    so its lines leave one by one, and the counters say nothing was joined."""
    data = b"".join(b'{"pid":1,"message":%s}\n' % line for line in (
        b'"Traceback (most recent call last):"', b'"  File \\"\\ud800\\", line 9"',
        b'"ValueError: x"'))
    proc = ship(receiver, data, "--json", "--multiline", "python", "--multiline-source", "pid")
    assert len(receiver.messages()) == 3
    assert b"Joined 0 lines into 0 multi-line events" in proc.stderr, proc.stderr


def test_max_lines_cuts_each_source_apart(receiver):
    lines = numbered_traces(["a", "b"], 7)
    proc = ship(receiver, b"\n".join(lines) + b"\n", "--json", "--multiline-pattern", r"^\s",
                "--multiline-max-lines", "3", "--multiline-source", "src")
    for name, events in by_source(receiver.events()).items():
        assert [len(e["message"].splitlines()) for e in events] == [3, 3, 2]
        assert [e.get("@continues", False) for e in events] == [True, True, False]
        assert [e["n"] for e in events] == [0, 3, 6]  # each part its own first line's fields
        assert "".join(e["message"] for e in events).startswith(f"head {name}\n")
    assert "(4 cut at a cap)" in proc.stderr.decode()


def test_max_bytes_cuts_each_source_apart(receiver):
    lines = numbered_traces(["a", "b"], 40)
    ship(receiver, b"\n".join(lines) + b"\n", "--json", "--multiline-pattern", r"^\s",
         "--multiline-max-bytes", "200", "--multiline-source", "src")
    for name, events in by_source(receiver.events()).items():
        assert len(events) > 2 and all(  # with the newline that ends a cut event
            len(e["message"].encode()) <= 200 + e.get("@continues", 0) for e in events)
        assert all(e.get("@continues") for e in events[:-1]) and "@continues" not in events[-1]
        assert "".join(e["message"] for e in events) == "\n".join(
            [f"head {name}"] + [f"  frame {name} {n} " for n in range(1, 41)])


def test_past_the_sources_bound_the_oldest_event_leaves_marked_and_counted(receiver):
    """One more source than MULTILINE_SOURCES begins a Python traceback: the
    first source's leaves as it is, marked "@continues" and counted (issue 34),
    its next line on its own."""
    names = [f"s{n}" for n in range(zmqpush.MULTILINE_SOURCES + 1)]
    lines = [json.dumps({"src": name, "message": m}).encode() for name in names for m in
             ("Traceback (most recent call last):", f"    frame {name} 1")]
    lines += [json.dumps({"src": name, "message": f"    frame {name} 2"}).encode()
              for name in names]
    proc = ship(receiver, b"\n".join(lines) + b"\n", "--json", "--multiline", "python",
                "--multiline-source", "src")
    sources = by_source(receiver.events())
    assert [e["message"] for e in sources["s0"]] == [
        "Traceback (most recent call last):\n    frame s0 1\n", "    frame s0 2"]
    assert [e.get("@continues") for e in sources["s0"]] == [True, None]
    assert all(len(sources[name]) == 1 and "@continues" not in sources[name][0]
               for name in names[1:])
    assert "(0 cut at a cap, 1 pushed out unfinished past the source caps)" in \
        proc.stderr.decode()


def test_past_the_held_bytes_bound_the_oldest_events_leave_marked_and_counted(receiver):
    """Four sources whose events would hold more than MULTILINE_SOURCE_BYTES
    together: the oldest leave early, marked "@continues" and counted (issue
    34); nothing is lost."""
    frames = zmqpush.MULTILINE_SOURCE_BYTES // 4 // 1000 + 50
    lines = numbered_traces(["a", "b", "c", "d"], frames, width=1000)
    proc = ship(receiver, b"\n".join(lines) + b"\n", "--json", "--multiline-pattern", r"^\s",
                "--multiline-source", "src", "--multiline-max-lines", "100000",
                "--max-line-bytes", str(4 << 20), "--memory-bytes", str(1 << 30))
    sources = by_source(receiver.events())
    assert sum(map(len, sources.values())) > 4
    for events in sources.values():
        assert all(e.get("@continues") for e in events[:-1])
        assert sum(len(e["message"].splitlines()) for e in events) == frames + 1
        assert all(e["message"].endswith("\n") for e in events[:-1])
    marked = sum(bool(e.get("@continues")) for events in sources.values() for e in events)
    assert marked and f"(0 cut at a cap, {marked} pushed out unfinished" in proc.stderr.decode()


# ------------------------------------------------------ leaving on time --
def pending_sources(receiver: Receiver, *args) -> subprocess.Popen:
    proc = start(["-q", "-c", receiver.endpoint, "--json", "--multiline", "python",
                  "--multiline-source", "p", *args])
    proc.stdin.write(b'{"p":"a","message":"before"}\n' + b"".join(
        b'{"p":"%s","message":"%s"}\n' % (p, m) for m, p in [
            (b"Traceback (most recent call last):", b"a"),
            (b"Traceback (most recent call last):", b"b"),
            (b'  File \\"x\\", line 1', b"a"), (b'  File \\"y\\", line 2', b"b")]))
    proc.stdin.flush()
    assert receiver.wait_for(1, 10) == 1
    return proc


TRACE = {"a": 'Traceback (most recent call last):\n  File "x", line 1',
         "b": 'Traceback (most recent call last):\n  File "y", line 2'}


@pytest.mark.alone
def test_the_quiet_timeout_flushes_each_source_on_its_own(receiver):
    """a goes quiet at once, c a little later, while b's lines keep coming:
    a's and c's events leave each after its own timeout, b's only once b is
    quiet."""
    proc = pending_sources(receiver, "--multiline-timeout", "0.5")
    try:
        for n in range(15):  # b continues every 0.1 s: 1.5 s of lines
            time.sleep(0.1)
            proc.stdin.write(b'{"p":"b","message":"    frame %d"}\n' % n)
            if n == 0:
                proc.stdin.write(b'{"p":"c","message":"Traceback (most recent call last):"}\n'
                                 b'{"p":"c","message":"    frame c"}\n')
            proc.stdin.flush()
            if n == 12:  # 1.3 s: a's and c's timeouts passed, b's not
                assert receiver.messages() == [
                    "before", TRACE["a"], "Traceback (most recent call last):\n    frame c"]
        b = TRACE["b"] + "".join(f"\n    frame {n}" for n in range(15))
        assert receiver.wait_for(4, 10) == 4
        assert receiver.messages()[3] == b
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_once_the_quiet_timeout_flushed_every_source_the_loop_sleeps(receiver):
    """Not alone: it measures no time (wakeups_once_settled)."""
    proc = pending_sources(receiver, "--multiline-timeout", "0.2")
    try:
        assert receiver.wait_for(3, 10) == 3
        assert sorted(receiver.messages()) == sorted(["before", TRACE["a"], TRACE["b"]])
        assert wakeups_once_settled(proc) == 0  # after the replay window's quiet checks
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


@pytest.mark.parametrize("how", ["sigterm", "eof", "sigusr1"])
def test_every_pending_source_leaves_at_stop_eof_and_report(receiver, how):
    proc = pending_sources(receiver, "--multiline-timeout", "600")
    try:
        time.sleep(0.3)
        if how == "eof":
            proc.stdin.close()
        else:
            proc.send_signal(signal.SIGTERM if how == "sigterm" else signal.SIGUSR1)
        assert receiver.wait_for(3, 10) == 3
        assert receiver.messages() == ["before", TRACE["a"], TRACE["b"]]
        if how == "sigusr1":
            proc.stdin.close()
        assert proc.wait(10) == 0
        if how == "sigusr1":
            assert b" joined=2 joined_lines=4 cut=0" in proc.stderr.read()
    finally:
        stop_process(proc)


# -------------------------------------------------------------- options --
@pytest.mark.parametrize("args, says", [
    (["--json", "--multiline-source", "program"], "--multiline-source needs --multiline"),
    (["--multiline", "python", "--multiline-source", "program"],
     "--multiline-source needs --json or --journal"),
    (["--json", "--multiline", "python", "--multiline-source", " , "],
     "invalid comma-separated list of keys value"),
], ids=["no-multiline", "no-json", "empty"])
def test_bad_source_options_are_usage_errors(args, says):
    proc = run(args, b"")
    assert proc.returncode == 2
    assert says in proc.stderr.decode() and b"Traceback" not in proc.stderr
    assert len(proc.stderr.decode().splitlines()) == 1


def test_the_environment_twin_names_the_keys(receiver, tmp_path):
    chained, group = python_traces(tmp_path)[:2]
    data = b"".join(line + b"\n" for line in alternate(rsyslog_lines("a", chained),
                                                       rsyslog_lines("b", group)))
    ship(receiver, data, env={"ZMQPUSH_JSON": "1", "ZMQPUSH_MULTILINE": "python",
                              "ZMQPUSH_MULTILINE_SOURCE": "program"})
    assert [e["message"] for e in receiver.events() if e["program"] == "a"] == alone(chained)


def test_held_lines_count_in_the_memory_bound():
    """Settings that just fit --memory-bytes with --json no longer fit once
    lines are held per source: a usage error, not a silent overrun."""
    fixed = ["--json", "--queue-bytes", str(4 << 20), "--replay-bytes", str(16 << 20),
             "-c", f"tcp://127.0.0.1:{free_port()}", "--linger", "0"]
    need = zmqpush.memory_need((4 + 16 + 4) << 20, 64 << 10, 256 << 10, parses=True)
    fits = run([*fixed, "--memory-bytes", str(need)], b"")
    assert fits.returncode == 0, fits.stderr
    joined = run([*fixed, "--memory-bytes", str(need), "--multiline", "python"], b"")
    assert joined.returncode == 2 and b"over --memory-bytes" in joined.stderr
