"""Multi-line events (--multiline, --multiline-pattern): the traces the real
runtimes print (python3, java, ruby, go; recorded Go samples where go is
missing) arrive as one event each, among ordinary lines that stay as they are;
caps, timeout, signals, --batch, --event-id and --spool (--confirm:
test_multiline_confirm.py).  Real processes and sockets on 127.0.0.1."""
import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
from test_shipping import wakeups_once_settled
from test_stages import pattern_messages

from conftest import Receiver, free_port, run, start, stop_process, unstamped

SAMPLES = Path(__file__).resolve().parent / "samples"
PLAIN = {b"plain line before", b"plain line after"}

PYTHON_PROGRAMS = {
    "chained": (
        "def inner():\n    return {}['missing']\n"
        "def outer():\n    try:\n        inner()\n    except KeyError as exc:\n"
        "        raise ValueError('bad value') from exc\n"
        "import sys\nprint('plain line before', file=sys.stderr, flush=True)\n"
        "try:\n    outer()\nexcept ValueError:\n    x = 1 / 0\n"),
    "group": "raise ExceptionGroup('eg', [ValueError(1), TypeError(2)])\n",
    "recursion": "def f(n):\n    return f(n + 1)\nf(0)\n",
    "syntax": "def (\n",
}

JAVA_PROGRAM = """\
public class Trace {
    static void inner() { throw new IllegalStateException("inner failure"); }
    static void middle() {
        try { inner(); } catch (IllegalStateException e) {
            throw new RuntimeException("middle wrapped", e); }
    }
    public static void main(String[] args) throws Exception {
        System.err.println("plain line before");
        try { middle(); } catch (RuntimeException e) {
            Exception top = new Exception("top level", e);
            top.addSuppressed(new java.io.IOException("closing failed"));
            top.printStackTrace();
        }
        System.err.println("plain line after");
        middle();
    }
}
"""

RUBY_PROGRAM = """\
def inner
  raise ArgumentError, "inner failure"
end
def outer
  inner
rescue ArgumentError
  raise "outer failure"
end
$stderr.puts "plain line before"
outer
"""

GO_PROGRAM = """\
package main

import (
\t"fmt"
\t"os"
)

func worker(ch chan int) { <-ch }

func main() {
\tfmt.Fprintln(os.Stderr, "plain line before")
\tch := make(chan int)
\tgo worker(ch)
\tdefer func() { panic(fmt.Sprintf("second: %v", recover())) }()
\tpanic("first")
}
"""


def stderr_of(argv: list, tmp_path: Path, env=None) -> bytes:
    """What a program that fails prints on stderr."""
    proc = subprocess.run(argv, capture_output=True, timeout=120, cwd=tmp_path,
                          env={**os.environ, **(env or {})})
    assert proc.returncode != 0 and proc.stderr, proc
    return proc.stderr


def python_traces(tmp_path: Path) -> list:
    out = []
    for name, program in PYTHON_PROGRAMS.items():
        path = tmp_path / f"{name}.py"
        path.write_text(program)
        out.append(stderr_of([sys.executable, str(path)], tmp_path))
    return out


def java_traces(tmp_path: Path) -> list:
    if shutil.which("java") is None:
        pytest.skip("no java")
    (tmp_path / "Trace.java").write_text(JAVA_PROGRAM)
    return [stderr_of(["java", "Trace.java"], tmp_path)]


def ruby_traces(tmp_path: Path) -> list:
    if shutil.which("ruby") is None:
        pytest.skip("no ruby (Debian: apt-get install ruby)")
    (tmp_path / "trace.rb").write_text(RUBY_PROGRAM)
    return [stderr_of(["ruby", "trace.rb"], tmp_path)]


def go_traces(tmp_path: Path) -> list:
    """The Go program's panic (GOTRACEBACK=all: every goroutine) when go is
    installed; the samples recorded from the same program otherwise."""
    recorded = [(SAMPLES / name).read_bytes()
                for name in ("go-panic.txt", "go-recovered-panic.txt")]
    if shutil.which("go") is None:
        return recorded
    (tmp_path / "trace.go").write_text(GO_PROGRAM)
    env = {"HOME": str(tmp_path), "GOCACHE": str(tmp_path / "cache"),
           "GOPATH": str(tmp_path / "gopath"), "GOFLAGS": "-mod=mod"}
    built = subprocess.run(["go", "build", "-o", "trace", "trace.go"], cwd=tmp_path,
                           capture_output=True, timeout=300, env={**os.environ, **env})
    assert built.returncode == 0, built.stderr
    return [stderr_of([str(tmp_path / "trace")], tmp_path, {"GOTRACEBACK": "all"}),
            *recorded]


TRACES = {"python": python_traces, "java": java_traces, "ruby": ruby_traces, "go": go_traces}


def interleaved(traces: list) -> tuple:
    """(input, expected messages): each trace between ordinary lines; the
    trace's own plain lines and the ordinary ones are events of their own,
    the lines between them one event."""
    data, expected = b"", []
    for n, trace in enumerate(traces):
        data += b"ordinary %d before\n" % n + trace + b"%d ordinary after\n" % n
        expected.append(f"ordinary {n} before")
        group: list = []
        for line in trace.rstrip(b"\n").split(b"\n"):
            if line in PLAIN:
                if group:
                    expected.append(b"\n".join(group).decode())
                    group = []
                expected.append(line.decode())
            else:
                group.append(line)
        if group:
            expected.append(b"\n".join(group).decode())
        expected.append(f"{n} ordinary after")
    return data, expected


def ship(receiver: Receiver, data: bytes, *args, env=None) -> subprocess.CompletedProcess:
    proc = run(["-q", "-c", receiver.endpoint, *args], data, env=env)
    assert proc.returncode == 0, proc.stderr
    receiver.settle()
    return proc


@pytest.mark.parametrize("runtime", list(TRACES))
def test_each_trace_a_runtime_prints_arrives_as_one_event(receiver, tmp_path, runtime):
    data, expected = interleaved(TRACES[runtime](tmp_path))
    proc = ship(receiver, data, "--multiline", runtime)
    assert receiver.messages() == expected
    joined = sum("\n" in m for m in expected)
    assert joined and f" into {joined} multi-line events (0 cut at a cap)" in proc.stderr.decode()


def test_all_presets_at_once_keep_each_runtime_s_traces_apart(receiver, tmp_path):
    traces = [t for make in TRACES.values() for t in make(tmp_path)]
    data, expected = interleaved(traces)
    ship(receiver, data, "--multiline", "python,java,go,ruby")
    assert receiver.messages() == expected


def test_a_trace_written_line_by_line_is_still_one_event(tmp_path):
    """One write a line (as rsyslog sends them): joining does not depend on reads."""
    data, expected = interleaved(python_traces(tmp_path) + ruby_traces(tmp_path))
    receiver = Receiver(free_port())
    proc = start(["-q", "-c", receiver.endpoint, "--multiline", "python,ruby"])
    try:
        for line in data.splitlines(keepends=True):
            proc.stdin.write(line)
            proc.stdin.flush()
            time.sleep(0.002)
        proc.stdin.close()
        assert proc.wait(30) == 0
        receiver.settle()
        assert receiver.messages() == expected
    finally:
        stop_process(proc)
        receiver.stop()


def test_ordinary_lines_keep_their_wire_format_byte_for_byte(tmp_path):
    """Quotes, tabs, backslashes, controls, CRLF and invalid UTF-8: the frames
    are the plain mode's (the pid aside)."""
    data = (b'say "hi"\tthere\\ \x1b[0m\r\nbad \xff\xfe bytes\ncaf\xc3\xa9\n\n  indented\n'
            b"\tat tab but no head\nlast without newline")
    frames = []
    for mode in ([], ["--multiline", "python,go,ruby"]):
        receiver = Receiver(free_port())
        try:
            proc = ship(receiver, data, *mode)
            pid = b'"@pid":%d' % proc_pid(proc)
            frames.append([f.replace(pid, b'"@pid":PID') for f in receiver.frames])
        finally:
            receiver.stop()
    assert frames[0] == frames[1] and len(frames[0]) == 7


def proc_pid(proc: subprocess.CompletedProcess) -> int:
    return int(proc.stderr.decode().rsplit("@pid:", 1)[1].split(".")[0].split()[0])


def test_an_endless_trace_is_cut_at_max_lines_and_nothing_is_lost(receiver):
    lines = [b"Traceback (most recent call last):"] + [
        b'  File "x.py", line %d, in f' % n for n in range(1200)] + [b"RecursionError: deep"]
    proc = ship(receiver, b"\n".join(lines) + b"\n1 next\n", "--multiline", "python",
                "--multiline-max-lines", "500")
    events = receiver.events()
    assert [len(e["message"].splitlines()) for e in events] == [500, 500, 202, 1]
    assert [e.get("@continues", False) for e in events] == [True, True, False, False]
    assert "".join(e["message"] for e in events[:3]).encode() == b"\n".join(lines)
    assert "(2 cut at a cap)" in proc.stderr.decode()


def java_overflow(frames: int) -> list:
    """A StackOverflowError's lines: its line and frames."""
    return [b'Exception in thread "main" java.lang.StackOverflowError'] + [
        b"\tat Deep.recurse(Deep.java:%d)" % (n % 7 + 3) for n in range(frames)]


def test_a_java_stack_overflow_at_the_default_depth_is_one_event(receiver):
    """The JVM prints 1,024 frames of a StackOverflowError: 1,025 lines, within
    the default --multiline-max-lines (issue 35, outside35 12)."""
    trace = java_overflow(1024)
    ship(receiver, b"\n".join(trace) + b"\n2026-11-27 10:00:00 INFO next\n", "--multiline", "java")
    assert receiver.messages() == [b"\n".join(trace).decode(), "2026-11-27 10:00:00 INFO next"]


def test_a_java_trace_past_the_default_cap_is_given_back_by_concatenating(receiver):
    """A trace of 2,501 lines at the defaults: the pieces, concatenated in
    order, are the trace byte for byte ("@continues" means the next message
    goes on, for a cut event as for a cut line)."""
    trace = java_overflow(2500)
    ship(receiver, b"\n".join(trace) + b"\n2026-11-27 10:00:00 INFO next\n", "--multiline", "java")
    events = receiver.events()
    assert [e.get("@continues", False) for e in events] == [True, True, False, False]
    assert "".join(e["message"] for e in events[:3]).encode() == b"\n".join(trace)
    assert events[3]["message"] == "2026-11-27 10:00:00 INFO next"


def test_a_joined_event_is_cut_at_max_bytes(receiver):
    lines = [b"Traceback (most recent call last):"] + [b"    frame %04d" % n for n in range(40)]
    ship(receiver, b"\n".join(lines) + b"\n", "--multiline", "python",
         "--multiline-max-bytes", "200")
    events = receiver.events()
    assert len(events) > 2 and all(  # with the newline that ends a cut event
        len(e["message"].encode()) <= 200 + e.get("@continues", 0) for e in events)
    assert all(e.get("@continues") for e in events[:-1]) and "@continues" not in events[-1]
    assert "".join(e["message"] for e in events).encode() == b"\n".join(lines)


def test_max_line_bytes_applies_to_the_joined_event(receiver):
    long_frame = b"    " + b"x" * 300
    lines = [b"Traceback (most recent call last):", b'  File "a.py", line 1, in f',
             long_frame, b"ValueError: v"]
    ship(receiver, b"\n".join(lines) + b"\n", "--multiline", "python", "--max-line-bytes", "128")
    messages = [m.encode() for m in receiver.messages()]
    assert all(len(m) <= 128 for m in messages)
    assert b"".join(messages).replace(b"\n", b"") == b"".join(lines)


def test_continuation_lines_with_no_start(receiver):
    """Frames with no head: Java's make an event of their own, and so do
    Python's '  File' lines without a "Traceback" line (traceback.print_stack()
    prints them so)."""
    data = (b"\tat a.B.c(B.java:1)\n\tat a.B.d(B.java:2)\nplain\n"
            b'  File "x.py", line 2, in f\n    f()\nplain\n')
    ship(receiver, data, "--multiline", "java,python")
    assert receiver.messages() == ["\tat a.B.c(B.java:1)\n\tat a.B.d(B.java:2)", "plain",
                                   '  File "x.py", line 2, in f\n    f()', "plain"]


def test_a_trace_at_eof_without_a_newline_is_one_event(receiver):
    data = b"before\nTraceback (most recent call last):\n  File \"x\", line 1\nValueError: end"
    ship(receiver, data, "--multiline", "python")
    assert receiver.messages() == ["before", data[7:].decode()]


def test_lines_made_to_be_slow_for_the_presets_stay_cheap(receiver):
    """Long lines that hold, again and again, what a preset's regular
    expressions look for: a rule that backtracks would take minutes a line."""
    lines = [b"x" + b":1:in `" * 100000, b'  File "' + b'", line 1x' * 40000,
             b"Exception in thread \"" + b'" x' * 130000, b"a(" + b")x" * 200000,
             b"x in a:1x" * 80000, b"/" + b"a:1x" * 150000, b"Error" * 140000,
             b"E, [" + b"] ERROR -- " * 60000, b"http: panic" * 60000] * 2
    proc = run(["-q", "-c", receiver.endpoint, "--multiline", "python,java,go,ruby,php,node",
                "--max-line-bytes", str(1 << 20)], b"\n".join(lines) + b"\n", timeout=60)
    assert proc.returncode == 0, proc.stderr
    receiver.settle()
    assert [m.encode() for m in receiver.messages()] == lines


FILEBEAT_JAVA = r"^[[:space:]]+(at|\.{3})[[:space:]]+\b|^Caused by:"


def test_filebeat_s_java_pattern_reads_posix_classes_as_go_does(tmp_path):
    """Filebeat's documented Java pattern: [[:space:]] is Go's whitespace class (to
    Python's re alone it is a set of the characters :space, and a warning).  The
    Joiner in this process, with the rule the options name, on a real JVM's trace."""
    data, _ = interleaved(java_traces(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        posix = pattern_messages(data, "--multiline-pattern", FILEBEAT_JAVA)
    python = pattern_messages(data, "--multiline-pattern",
                              FILEBEAT_JAVA.replace("[[:space:]]", r"[\t\n\v\f\r ]"))
    assert posix == python
    assert any(m.count("\n\tat ") > 2 for m in posix)


def test_a_pattern_that_always_matches_makes_events_of_max_lines(receiver):
    data = b"".join(b"line %d\n" % n for n in range(1100))
    ship(receiver, data, "--multiline-pattern", "", "--multiline-max-lines", "500")
    assert [len(m.splitlines()) for m in receiver.messages()] == [500, 500, 100]
    assert "".join(receiver.messages()).encode() + b"\n" == data


def test_batch_carries_joined_events_in_arrays_with_their_fields(receiver, tmp_path):
    data, expected = interleaved(python_traces(tmp_path))
    ship(receiver, data, "--multiline", "python", "--batch", "--timestamp", "-f", "app=demo")
    assert receiver.messages() == expected
    assert all(e["@timestamp"].endswith("Z") and e["app"] == "demo" for e in receiver.events())
    assert len(receiver.frames) < len(expected)
    assert all(frame.startswith(b"[") for frame in receiver.frames)


def test_a_joined_event_has_one_event_id(receiver, tmp_path):
    data, expected = interleaved(python_traces(tmp_path))
    ship(receiver, data, "--multiline", "python", "--event-id")
    events = receiver.events()
    assert [e["message"] for e in events] == expected
    ids = [e["@metadata"]["_id"] for e in events]
    run_id = ids[0].rsplit("-", 1)[0]
    assert ids == [f"{run_id}-{n}" for n in range(len(expected))]


def test_spool_keeps_joined_events(receiver, tmp_path):
    data, expected = interleaved(python_traces(tmp_path))
    ship(receiver, data, "--multiline", "python", "--spool", str(tmp_path / "spool"))
    assert receiver.messages() == expected


def test_spool_replays_joined_events_to_the_next_run(tmp_path):
    """No receiver: the joined events stay in the spool; the next run sends them."""
    data, expected = interleaved(python_traces(tmp_path))
    port = free_port()
    spool = str(tmp_path / "spool")
    first = run(["-q", "-c", f"tcp://127.0.0.1:{port}", "--linger", "0.2", "--multiline",
                 "python", "--spool", spool], data)
    assert first.returncode == 3, first.stderr
    receiver = Receiver(port)
    try:
        again = run(["-q", "-c", receiver.endpoint, "--spool", spool], b"")
        assert again.returncode == 0, again.stderr
        receiver.settle()
        assert receiver.messages() == expected
    finally:
        receiver.stop()


def test_blank_lines_held_after_a_go_panic_count_against_the_caps(receiver):
    """Blank lines are held until the next line tells whether the panic goes on:
    held past --multiline-max-lines, the event ends and they go as lines (without
    the cap an endless run of them was held, and memory grew without bound)."""
    proc = start(["-q", "-c", receiver.endpoint, "--multiline", "go",
                  "--multiline-max-lines", "5", "--multiline-timeout", "60"])
    try:
        proc.stdin.write(b"panic: x\n" + b"\n" * 10_000)
        proc.stdin.flush()
        assert receiver.wait_for(9_000, 15) >= 9_000  # while stdin stays open
        proc.stdin.close()
        assert proc.wait(20) == 0
        messages = receiver.messages()
        assert sum(m.count("\n") + 1 for m in messages) == 10_001
        assert messages[0].startswith("panic: x")
    finally:
        stop_process(proc)


@pytest.mark.parametrize("args, says", [
    (["--multiline-negate"], "--multiline-negate needs --multiline"),
    (["--multiline", "python", "--multiline-pattern", "x"], "cannot be combined"),
    (["--multiline", "cobol"], "list of python, java, go, ruby, php, node value"),
    (["--multiline-pattern", "("], "invalid Python regular expression"),
    (["--multiline-pattern", r"^(\s*at .+)+$"], "without a repetition or an alternation"),
    (["--multiline-pattern", r"(a|aa)+$"], "without a repetition or an alternation"),
    (["--multiline-pattern", r"(a{1,9}){1,99}$"], "without a repetition or an alternation"),
    (["--multiline", "python", "--multiline-max-bytes", "70000"], "over --max-line-bytes"),
    (["--multiline-pattern", "[[:^digit:]]"], "[:^digit:] (a negated class) has no Python"),
    (["--multiline-pattern", "[[:digits:]]"], "[:digits:] is not a POSIX class (alnum,"),
    (["--multiline-pattern", "^[a&&b]"], "Possible set intersection at position 3"),
    (["--multiline-pattern", "x{99999999999}"], "invalid Python regular expression"),
], ids=["negate-alone", "both", "unknown-preset", "bad-pattern", "nested-repetition",
        "repeated-alternation", "nested-bounded-repetition", "over-line-bytes",
        "negated-posix-class", "unknown-posix-class", "python-would-warn",
        "repetition-count-too-large"])
def test_bad_multiline_options_are_usage_errors(args, says):
    proc = run(args, b"")
    assert proc.returncode == 2
    assert says in proc.stderr.decode() and b"Traceback" not in proc.stderr


def test_environment_twins(receiver, tmp_path):
    data, expected = interleaved(python_traces(tmp_path)[:1])
    ship(receiver, data, env={"ZMQPUSH_MULTILINE": "python",
                              "ZMQPUSH_MULTILINE_MAX_LINES": "3"})
    assert len(receiver.messages()) > len(expected)  # the trace cut every 3 lines
    assert all(len(m.splitlines()) <= 3 for m in receiver.messages())


def pending_trace(receiver: Receiver, *args) -> subprocess.Popen:
    """zmqpush holding a pending Python trace, the line before it delivered."""
    proc = start(["-q", "-c", receiver.endpoint, "--multiline", "python", *args])
    proc.stdin.write(b"before\nTraceback (most recent call last):\n  File \"x\", line 1\n"
                     b"ValueError: v\n")
    proc.stdin.flush()
    assert receiver.wait_for(1, 10) == 1
    return proc


TRACE_TEXT = "Traceback (most recent call last):\n  File \"x\", line 1\nValueError: v"


def test_sigterm_ships_the_pending_event(receiver):
    proc = pending_trace(receiver, "--multiline-timeout", "600")
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
        receiver.settle()
        assert receiver.messages() == ["before", TRACE_TEXT]
    finally:
        stop_process(proc)


def test_sigusr1_ships_the_pending_event_before_it_reports(receiver):
    proc = pending_trace(receiver, "--multiline-timeout", "600")
    try:
        time.sleep(0.3)
        proc.send_signal(signal.SIGUSR1)
        assert receiver.wait_for(2, 10) == 2
        assert receiver.messages() == ["before", TRACE_TEXT]
        proc.stdin.close()
        assert proc.wait(10) == 0
        report = [line for line in proc.stderr.read().decode().splitlines()
                  if unstamped(line).startswith("zmqpush: read=")]
        assert report and " read=2 " in report[0] and " joined=1 joined_lines=3 cut=0" in report[0]
    finally:
        stop_process(proc)


def test_the_quiet_timeout_ships_the_event_then_the_loop_sleeps(receiver):
    """The pending event leaves after the timeout while stdin stays open (no
    sooner: load only delays it); the timer runs only while an event is pending:
    afterwards no wake-up."""
    proc = start(["-q", "-c", receiver.endpoint, "--multiline", "python",
                  "--multiline-timeout", "0.5"])
    try:
        proc.stdin.write(b"before\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        written = time.monotonic()
        proc.stdin.write(b"Traceback (most recent call last):\n  File \"x\", line 1\n"
                         b"ValueError: v\n")
        proc.stdin.flush()
        assert receiver.wait_for(2, 10) == 2
        assert time.monotonic() - written >= 0.5
        assert receiver.messages() == ["before", TRACE_TEXT]
        assert wakeups_once_settled(proc) == 0
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_idle_with_no_event_pending_the_main_thread_never_wakes(receiver):
    """Ordinary lines leave at once and hold nothing: no timer runs."""
    proc = start(["-q", "-c", receiver.endpoint, "--multiline",
                  "python,java,go,ruby,php,node"])
    try:
        proc.stdin.write(b"one line, then silence\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        assert wakeups_once_settled(proc) == 0
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_stats_count_joined_lines_and_events(receiver, tmp_path):
    data, expected = interleaved(python_traces(tmp_path))
    proc = ship(receiver, data, "--multiline", "python", "--stats", "0.1")
    joined = [m for m in expected if "\n" in m]
    lines = sum(m.count("\n") + 1 for m in joined)
    assert f"Joined {lines} lines into {len(joined)} multi-line events" in proc.stderr.decode()
    assert receiver.messages() == expected
