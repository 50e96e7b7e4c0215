"""The presets on what the runtimes really print (issue 35): programs in
python3, java (with java.util.logging, logback and log4j2), go, ruby, node and
php print each shape of trace the issue lists, once per module; each trace
arrives as one event, each ordinary line and each logging record before a
trace as its own, bytes in order.  Between shapes a program prints a mark, a
timestamped line that is an event of its own.  Real processes and sockets on
127.0.0.1."""
import fcntl
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rsyslog
from test_structured import BOOT_ID, JOURNAL_REMOTE, export_entry, journalctl

import zmqpush
from conftest import ZMQPUSH, Receiver, free_port, run, start, stop_process

MARK = "2026-11-27 10:00:00.000 mark"
ALL = "python,java,go,ruby,node,php"
CLASSPATH_JARS = ("slf4j-api", "logback-classic", "logback-core", "log4j-api", "log4j-core")

# Each program prints its shapes with MARK between them; SHAPES[runtime] lists,
# per program, how the text between marks splits into events: sizes in lines from
# the front (1: a line of its own), 0 for "the rest but the groups after it"
# (which count from the end).
PYTHON = {
    "logged.py": ("""\
import logging, sys, traceback
logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
MARK = {mark!r}
try:
    {{}}["missing"]
except KeyError:
    logging.exception("lookup failed")
print(MARK, file=sys.stderr, flush=True)
try:
    e = ValueError("bad value")
    e.add_note("note one")
    e.add_note("note two")
    raise e
except ValueError:
    traceback.print_exc()
print(MARK, file=sys.stderr, flush=True)
try:
    raise ValueError("2 validation errors for User\\nname\\n  Field required [type=missing]"
                     "\\nage\\n  Input should be a valid integer [type=int_parsing]")
except ValueError:
    logging.getLogger("app").exception("validation")
print(MARK, file=sys.stderr, flush=True)
logging.basicConfig()
logging.getLogger().handlers[0].setFormatter(logging.Formatter(logging.BASIC_FORMAT))
try:
    raise OSError("first line\\nsecond line")
except OSError:
    logging.exception("default format")
print(MARK, file=sys.stderr, flush=True)
""", [[1, 0], [0], [1, 0], [1, 0]]),
    # the runtime's own lines before and instead of a traceback (issue 35, outside35 1-6)
    "hooks.py": ("""\
import asyncio, faulthandler, gc, logging, sys, threading, traceback
logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
MARK = {mark!r}
def mark(): print(MARK, file=sys.stderr, flush=True)
def work(): return {{}}["missing"]
worker = threading.Thread(target=work, name="worker-1")
worker.start()
worker.join()
mark()
class Conn:
    def __del__(self): raise OSError("close failed: fd 7")
Conn()
mark()
async def boom(): raise ConnectionResetError("peer went away")
async def main():
    task = asyncio.get_running_loop().create_task(boom())
    await asyncio.sleep(0.01)
    del task
    gc.collect()
asyncio.run(main())
mark()
logging.getLogger("svc").warning("slow request", stack_info=True)
mark()
try:
    int("12x")
except ValueError:
    logging.getLogger("svc").error("parse failed", exc_info=True, stack_info=True)
print("an unstamped line after the stack", file=sys.stderr, flush=True)
mark()
def inner(): traceback.print_stack()
inner()
mark()
faulthandler.dump_traceback()
mark()
""", [[0], [0], [2, 0], [1, 0], [1, 0, 1], [0], [0]]),
    "segfault.py": ("import ctypes, faulthandler\nfaulthandler.enable()\n"
                    "def native(): ctypes.string_at(0)\nnative()\n", [[0]]),
    "chained.py": ("""\
def inner():
    raise KeyError("missing")
try:
    inner()
except KeyError as exc:
    raise ValueError("bad value") from exc
""", [[0]]),
}

JAVA_PROGRAM = """\
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.regex.Pattern;

public class Shapes {
    static class Declined extends Exception { Declined(String m) { super(m); } }
    static void mark() { System.err.println("MARK"); }
    public static void main(String[] args) throws Exception {
        Logger jul = Logger.getLogger("Shapes");
        try { Pattern.compile("user=(\\\\w+"); } catch (Exception e) {
            jul.log(Level.SEVERE, "pattern failed", e);
            mark();
            e.printStackTrace();
        }
        mark();
        org.slf4j.Logger lb = org.slf4j.LoggerFactory.getLogger(Shapes.class);
        lb.info("an ordinary logback line");
        try { Integer.parseInt("x"); } catch (Exception e) {
            lb.error("parse failed", new RuntimeException("wrapped", e));
        }
        mark();
        org.apache.logging.log4j.Logger l4 = org.apache.logging.log4j.LogManager.getLogger();
        l4.info("an ordinary log4j2 line");
        try { Object o = null; o.hashCode(); } catch (Exception e) { l4.error("npe", e); }
        mark();
        try { Integer.parseInt("y"); } catch (Exception e) {
            System.err.println(e);  // frames indented with spaces, as some formatters print them
            for (StackTraceElement f : e.getStackTrace()) System.err.println("     at " + f);
        }
        mark();
        new Declined("card rejected").printStackTrace();  // a class in the default package
        mark();
        Exception cause = new Exception("connection refused\\nhost=db-1 port=5432");
        new RuntimeException("order 42 not saved", cause).printStackTrace();
        mark();
        throw new IllegalStateException("uncaught\\nsecond line of the message");
    }
}
""".replace("MARK", MARK)

LOGBACK_XML = """\
<configuration><appender name="E" class="ch.qos.logback.core.ConsoleAppender">
<target>System.err</target><encoder>
<pattern>%d{yyyy-MM-dd HH:mm:ss.SSS} [%thread] %-5level %logger{36} - %msg%n</pattern>
</encoder></appender>
<root level="INFO"><appender-ref ref="E"/></root></configuration>
"""
LOG4J2_XML = """\
<Configuration><Appenders><Console name="E" target="SYSTEM_ERR">
<PatternLayout pattern="%d{ISO8601} %-5p [%t] %c{1}: %m%n"/></Console></Appenders>
<Loggers><Root level="info"><AppenderRef ref="E"/></Root></Loggers></Configuration>
"""

GO_PROGRAMS = {
    "serve.go": (f"""\
package main

import (
\t"fmt"
\t"log"
\t"net/http"
\t"net/http/httptest"
\t"os"
)

func main() {{
\tlog.Print("an ordinary log line")
\tfmt.Fprintln(os.Stderr, "{MARK}")
\tsrv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {{
\t\tvar m map[string]int
\t\tm["x"] = 1
\t}}))
\tdefer srv.Close()
\thttp.Get(srv.URL)
\tfmt.Fprintln(os.Stderr, "{MARK}")
}}
""", [[1], [0]]),
    # a panic value of several lines; a stack printed without a panic
    "stacks.go": (f"""\
package main

import (
\t"fmt"
\t"os"
\t"runtime/debug"
)

func main() {{
\tdebug.PrintStack()
\tfmt.Fprintln(os.Stderr, "{MARK}")
\tpanic("startup failed:\\n  port in use")
}}
""", [[0], [0]]),
    "overflow.go": ("""\
package main

func f(n int) int { return f(n+1) + 1 }

func main() { f(0) }
""", [[0]]),
}

RUBY_PROGRAMS = {
    "logger.rb": (f"""\
require "logger"
$stderr.sync = true
log = Logger.new($stderr)
def boom = raise(IOError, "disk gone")
begin
  boom
rescue => e
  log.error(e)
end
$stderr.puts "{MARK}"
begin
  raise ArgumentError, "line one\\nline two"
rescue => e
  log.error(e)
end
$stderr.puts "{MARK}"
log.info("an ordinary logger line")
""", [[0], [0], [1]]),
    # a Logger record not ending in (Class) before a report; a thread's report; a
    # Logger with its own formatter
    "reports.rb": (f"""\
require "logger"
$stderr.sync = true
log = Logger.new($stderr)
def find(id) = raise(KeyError, "user #{{id}} not found")
begin
  find(7)
rescue => e
  log.error "lookup failed"
  $stderr.puts e.full_message(highlight: false)
end
$stderr.puts "{MARK}"
Thread.new {{ raise IOError, "socket closed" }}.join rescue nil
$stderr.puts "{MARK}"
log.formatter = proc do |sev, time, _, msg|
  trace = msg.is_a?(Exception) ? "\\n" + msg.backtrace.join("\\n") : ""
  body = msg.is_a?(Exception) ? "#{{msg.message}} (#{{msg.class}})#{{trace}}" : msg
  "#{{time.utc.strftime("%Y-%m-%dT%H:%M:%S.%3NZ")}} [#{{sev}}] #{{body}}\\n"
end
begin
  find(8)
rescue => e
  log.error(e)
end
$stderr.puts "{MARK}"
""", [[1, 0], [0], [0]]),
    "overflow.rb": ("def deep(n) = deep(n + 1)\ndeep(0)\n", [[0]]),
    "highlight.rb": ("def a = b\ndef b = x.upcase\ndef x = nil\na\n", [[0]]),
    "mean.rb": ("def foo_bar; end\nfoo_baz\n", [[0]]),
    "message.rb": ("def inner = raise(ArgumentError, \"bad\")\n"
                   "begin\n  inner\nrescue\n  raise \"first\\nsecond\"\nend\n", [[0]]),
}

NODE_PROGRAMS = {
    "console.js": (f"""\
console.error(new Error("outer failure", {{ cause: new TypeError("inner cause") }}));
console.error("{MARK}");
const e = new Error("first line\\nsecond line");
e.code = "E_TEST";
console.error(e);
console.error("{MARK}");
console.error("an ordinary line");
""", [[0], [0], [1]]),
    "traced.js": ("function handler() { console.trace('slow path'); }\nhandler();\n", [[0]]),
    "assert_caught.js": ("try { require('assert').deepStrictEqual([1, 2], [1, 3]); }\n"
                         "catch (e) { console.error(e); }\n", [[0]]),
    "assert.js": ("require('assert').deepStrictEqual({ a: 1, b: [1, 2] }, { a: 1, b: [1, 3] });\n",
                  [[0]]),
    "uncaught.js": ("function f() { null.x; }\nf();\n", [[0]]),
    "rejected.js": ("async function g() { throw new RangeError('async\\nboom'); }\ng();\n",
                    [[0]]),
    "thrown.js": ("throw 'a string';\n", [[1, 0]]),
}

PHP_PROGRAMS = {
    "logged.php": (f"""\
<?php
function inner($v) {{ throw new InvalidArgumentException("bad value: $v"); }}
function outer() {{
    try {{ inner(3); }} catch (Exception $e) {{ throw new RuntimeException("wrapped", 5, $e); }}
}}
echo $undefined_var;
error_log("{MARK}");
try {{ outer(); }} catch (Exception $e) {{ error_log((string)$e); }}
error_log("{MARK}");
outer();
""", [[1], [0], [0]]),
    "fatal.php": ("<?php\nfunction f() {\n  throw new LogicException(\"line one\\nline two\");\n}\n"
                  "f();\n", [[0]]),
}


def need(command: str, package: str):
    if shutil.which(command) is None:
        pytest.skip(f"no {command} (Debian: apt-get install {package})")


def stderr_of(argv: list, cwd: Path, env=None) -> bytes:
    """What a program prints on stderr (its stdout discarded)."""
    proc = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          timeout=300, cwd=cwd, env={**os.environ, **(env or {})})
    assert proc.stderr, proc
    return proc.stderr


def regions(output: bytes, specs: list) -> list:
    """(region, spec) pairs: output split at MARK lines."""
    parts = output.split(MARK.encode() + b"\n")
    if parts[-1] == b"":
        parts.pop()
    assert len(parts) == len(specs), (output.decode(errors="replace"), specs)
    return list(zip(parts, specs))


# Debian's python3-yaml and python3-pydantic (1.10), run by Debian's python3.
DEBIAN_PYTHON = "/usr/bin/python3"
LIBRARY_PROGRAMS = {
    "yaml": ("import yaml\nyaml.safe_load('a: 1\\n  b: 2\\n')\n", [[0]]),
    "pydantic": ("import pydantic\nclass User(pydantic.BaseModel):\n    name: str\n"
                 "    age: int\nUser(age='x')\n", [[0]]),
}


def python_corpus(tmp: Path) -> list:
    """The programs above, and PyYAML's and pydantic's errors where Debian's
    python3 has them."""
    out = []
    for name, (program, specs) in PYTHON.items():
        (tmp / name).write_text(program.format(mark=MARK) if "{mark" in program else program)
        out += regions(stderr_of([sys.executable, name], tmp), specs)
    for module, (program, specs) in LIBRARY_PROGRAMS.items():
        found = subprocess.run([DEBIAN_PYTHON, "-c", f"import {module}"], capture_output=True)
        if found.returncode == 0:
            (tmp / f"{module}_error.py").write_text(program)
            out += regions(stderr_of([DEBIAN_PYTHON, f"{module}_error.py"], tmp), specs)
    return out


def java_corpus(tmp: Path) -> list:
    need("java", "default-jdk-headless")
    jars = [Path("/usr/share/java", f"{jar}.jar") for jar in CLASSPATH_JARS]
    if not all(jar.exists() for jar in jars):
        pytest.skip("no logback or log4j2 (Debian: liblogback-java liblog4j2-java)")
    (tmp / "Shapes.java").write_text(JAVA_PROGRAM)
    (tmp / "logback.xml").write_text(LOGBACK_XML)
    (tmp / "log4j2.xml").write_text(LOG4J2_XML)
    classpath = ":".join(map(str, jars)) + ":."
    output = stderr_of(["java", "-cp", classpath, "-Dlog4j2.configurationFile=log4j2.xml",
                        "Shapes.java"], tmp)
    # JUL's record (two lines), its trace, JUL's blank line; printStackTrace;
    # logback's info and error records, the trace; log4j2's; spaces; uncaught.
    return regions(output, [[2, 0, 1], [0], [1, 1, 0], [1, 1, 0], [0], [0], [0], [0]])


def go_corpus(tmp: Path) -> list:
    need("go", "golang-go")
    env = {"HOME": str(tmp), "GOCACHE": str(tmp / "cache"), "GOPATH": str(tmp / "gopath"),
           "GOFLAGS": "-mod=mod", "GO111MODULE": "off"}
    out = []
    for name, (program, specs) in GO_PROGRAMS.items():
        (tmp / name).write_text(program)
        built = subprocess.run(["go", "build", "-o", name[:-3], name], cwd=tmp,
                               capture_output=True, timeout=300, env={**os.environ, **env})
        assert built.returncode == 0, built.stderr
        out += regions(stderr_of([str(tmp / name[:-3])], tmp), specs)
    return out


def programs_corpus(tmp: Path, programs: dict, argv: list) -> list:
    out = []
    for name, (program, specs) in programs.items():
        (tmp / name).write_text(program)
        out += regions(stderr_of([*argv, name], tmp), specs)
    return out


def ruby_corpus(tmp: Path) -> list:
    need("ruby", "ruby")
    return programs_corpus(tmp, RUBY_PROGRAMS, ["ruby"])


def node_corpus(tmp: Path) -> list:
    need("node", "nodejs")
    return programs_corpus(tmp, NODE_PROGRAMS, ["node"])


def php_corpus(tmp: Path) -> list:
    need("php", "php-cli")
    return programs_corpus(tmp, PHP_PROGRAMS, ["php", "-n", "-d", "log_errors=1",
                                               "-d", "display_errors=0"])


CORPUS = {"python": python_corpus, "java": java_corpus, "go": go_corpus,
          "ruby": ruby_corpus, "node": node_corpus, "php": php_corpus}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> dict:
    """Each runtime's (region, spec) pairs, made once a run (the xdist workers
    share it through a file); a runtime that is not installed maps to the
    reason."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    cache = shared / "presets-corpus.json"
    with open(shared / "presets-corpus.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not cache.exists():
            cache.write_text(json.dumps(make_corpus(tmp_path_factory)))
    return {runtime: made if isinstance(made, str) else
            [(region.encode("latin-1"), spec) for region, spec in made]
            for runtime, made in json.loads(cache.read_text()).items()}


def make_corpus(tmp_path_factory) -> dict:
    """corpus() as JSON: each region's bytes as a latin-1 string."""
    made = {}
    for runtime, make in CORPUS.items():
        try:
            made[runtime] = [(region.decode("latin-1"), spec)
                             for region, spec in make(tmp_path_factory.mktemp(runtime))]
        except pytest.skip.Exception as skipped:
            made[runtime] = str(skipped)
    return made


def events_of(region: bytes, spec: list) -> list:
    """The events region makes by spec (see SHAPES above)."""
    lines = region[:-1].split(b"\n")  # a region ends with a newline
    rest = spec.index(0) if 0 in spec else len(spec)
    head, tail = spec[:rest], spec[rest + 1:]
    events, at = [], 0
    for size in head:
        events.append(lines[at:at + size])
        at += size
    end = len(lines) - sum(tail)
    if 0 in spec:
        events.append(lines[at:end])
    at = end
    for size in tail:
        events.append(lines[at:at + size])
        at += size
    assert at == len(lines) and all(events), (region, spec)
    return [b"\n".join(e).decode() for e in events]


def stream_of(pairs: list) -> tuple:
    """(input, expected messages): the regions with MARK between them."""
    data, expected = b"", []
    for region, spec in pairs:
        data += region + MARK.encode() + b"\n"
        expected += [*events_of(region, spec), MARK]
    return data, expected


def ship(data: bytes, *args) -> list:
    receiver = Receiver(free_port())
    try:
        proc = run(["-q", "-c", receiver.endpoint, "--multiline-timeout", "0.2", *args], data)
        assert proc.returncode == 0, proc.stderr
        receiver.settle()
        return receiver.messages()
    finally:
        receiver.stop()


def runtime_pairs(corpus: dict, runtime: str) -> list:
    if isinstance(corpus[runtime], str):
        pytest.skip(corpus[runtime])
    return corpus[runtime]


@pytest.mark.parametrize("runtime", list(CORPUS))
def test_every_trace_a_runtime_prints_is_one_event(corpus, runtime):
    data, expected = stream_of(runtime_pairs(corpus, runtime))
    assert ship(data, "--multiline", runtime) == expected


def test_all_six_presets_at_once_keep_every_runtime_s_traces(corpus):
    data, expected = stream_of(every_runtime(corpus))
    assert ship(data, "--multiline", ALL) == expected


def unblank(pairs: list) -> tuple:
    """(lines, expected messages) of the corpus as journald and rsyslog keep
    it: no blank lines (journald makes no entry of one; imfile skips them)."""
    data, expected = stream_of(pairs)
    lines = [line for line in data.split(b"\n") if line]
    events = ["\n".join(line for line in e.split("\n") if line) for e in expected]
    return lines, [e for e in events if e]


def every_runtime(corpus: dict) -> list:
    return [p for runtime in CORPUS if not isinstance(corpus[runtime], str)
            for p in corpus[runtime]]


def test_traces_read_back_from_a_real_journal_are_one_event_each(corpus, tmp_path):
    """journalctl -o json of a journal file systemd-journal-remote wrote: each
    line an entry of one unit and pid, no entry for a blank line (a chained
    Python traceback's "The above exception..." follows its exception line)."""
    if not os.path.exists(JOURNAL_REMOTE):
        pytest.fail(f"{JOURNAL_REMOTE} is missing: .ci/run installs systemd-journal-remote")
    lines, expected = unblank(every_runtime(corpus))
    export = b"".join(export_entry([
        (b"__REALTIME_TIMESTAMP", b"%d" % (1764072000000000 + n)),
        (b"__MONOTONIC_TIMESTAMP", b"%d" % (1000 + n)), (b"_BOOT_ID", BOOT_ID.encode()),
        (b"MESSAGE", line), (b"SYSLOG_IDENTIFIER", b"app"), (b"_PID", b"42"),
        (b"_HOSTNAME", b"web1"), (b"_SYSTEMD_UNIT", b"app.service")])
        for n, line in enumerate(lines))
    path = str(tmp_path / "traces.journal")
    subprocess.run([JOURNAL_REMOTE, "-o", path, "-"], input=export, check=True,
                   capture_output=True, timeout=30)
    assert ship(journalctl(path, "--all"), "--journal", "--multiline", ALL) == expected


def readme_rsyslog_json() -> str:
    """README "Structured logs"'s rsyslog configuration, as written there."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = re.search(r"\n((?:    .*\n)*    global\(.*\n(?:    .*\n)+)", text)[1]
    return "\n".join(line[4:] for line in block.splitlines())


def test_traces_through_rsyslog_configured_as_the_readme_says(corpus, tmp_path):
    """rsyslogd with its default escaping and README's own configuration
    (global(), template and action, as written there but for the endpoint):
    each line a syslog message, a tab kept a tab; joined per source."""
    assert rsyslog.available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"
    lines, expected = unblank(every_runtime(corpus))
    receiver = Receiver(free_port())
    config = readme_rsyslog_json().replace("/usr/local/bin/zmqpush.py", ZMQPUSH).replace(
        "tcp://logstash:2120", f"{receiver.endpoint} --multiline {ALL} --multiline-timeout 0.2"
        " --multiline-source logsource,program,pid")
    config, action = config.split("\naction(", 1)
    rs = rsyslog.PrivateRsyslog(tmp_path / "rsyslog", "action(" + action,
                                modules='module(load="omprog")\n' + config, escaping="")
    try:
        rs.start()
        with socket.create_connection(("127.0.0.1", rs.port)) as conn:
            conn.sendall(b"".join(b"<11>1 - web1 app 42 - - " + line + b"\n" for line in lines))
        receiver.wait_for(len(expected), 60)
        rs.stop()
        receiver.settle()
        assert receiver.messages() == expected
    finally:
        rs.stop()
        receiver.stop()


def test_every_trace_is_one_event_when_written_line_by_line(corpus):
    """One write a line (as rsyslog's omprog and a slow program send them): the
    presets find a trace's first line alone in a read too."""
    data, expected = stream_of(every_runtime(corpus))
    receiver = Receiver(free_port())
    proc = start(["-q", "-c", receiver.endpoint, "--multiline", ALL,
                  "--multiline-timeout", "5"])
    try:
        for line in data.splitlines(keepends=True):
            proc.stdin.write(line)
            proc.stdin.flush()
            time.sleep(0.001)
        proc.stdin.close()
        assert proc.wait(60) == 0
        receiver.settle()
        assert receiver.messages() == expected
    finally:
        stop_process(proc)
        receiver.stop()


def test_every_trace_is_one_event_wherever_a_read_ends(corpus):
    """The Joiner itself (in this process) fed the corpus in two reads, split
    at every line in turn: a trace's first lines at the end of one read, the
    rest in the next, are still one event.  A split inside a trace is made with
    the trace before and the one after it around it (each trace ends with MARK,
    an event of its own), not with the whole corpus again."""
    pairs = every_runtime(corpus)
    rule = zmqpush.joining_rule(zmqpush.Multiline(tuple(ALL.split(",")), None, False, True,
                                                  500, 1 << 20, 0.2))
    for index in range(len(pairs)):
        before = pairs[max(0, index - 1):index]
        data, expected = stream_of(before + pairs[index:index + 2])
        start = len(stream_of(before)[0])
        stop = start + len(stream_of(pairs[index:index + 1])[0])
        ends = [at + 1 for at in range(start, stop) if data[at] == 0x0A and at + 1 < len(data)]
        for end in ends:
            joiner = zmqpush.Joiner(rule, 500, 1 << 20, zmqpush.Counters())
            items = joiner.feed(data[:end]) + joiner.feed(data[end:]) + joiner.flush()
            assert messages_of(items) == expected, data[:end][-300:]


def test_each_trace_alone_among_ordinary_lines_is_one_event(corpus):
    """All six presets' one shared scan (Presets.scan) finds each trace when it
    is the only one in a read: each region alone after ordinary lines, in one
    feed and with the read ending inside it."""
    ordinary = [f"Nov 27 10:00:0{n} host app[7]: ordinary line {n} (ok)" for n in range(3)]
    rule = zmqpush.joining_rule(zmqpush.Multiline(tuple(ALL.split(",")), None, False, True,
                                                  500, 1 << 20, 0.2))
    for region, spec in every_runtime(corpus):
        data, expected = stream_of([(region, spec)])
        data = "".join(line + "\n" for line in ordinary).encode() + data
        middle = data.index(b"\n", len(data) // 2) + 1
        for reads in ([data], [data[:middle], data[middle:]]):
            joiner = zmqpush.Joiner(rule, 500, 1 << 20, zmqpush.Counters())
            items = [item for read in reads for item in joiner.feed(read)] + joiner.flush()
            assert messages_of(items) == ordinary + expected, region


def test_every_trace_is_one_event_in_a_read_of_its_own(corpus):
    """The Joiner fed each shape alone, one read: what triggers the presets'
    shared scan is in the shape itself, not in the other shapes' lines."""
    rule = zmqpush.joining_rule(zmqpush.Multiline(tuple(ALL.split(",")), None, False, True,
                                                  500, 1 << 20, 0.2))
    for region, spec in every_runtime(corpus):
        joiner = zmqpush.Joiner(rule, 500, 1 << 20, zmqpush.Counters())
        assert messages_of(joiner.feed(region) + joiner.flush()) == events_of(region, spec)


def messages_of(items: list) -> list:
    """The messages a Joiner's items make: a run's lines one by one, then events."""
    out = []
    for item in items:
        if item.joins:
            out += [text.decode() for text in item.texts]
        else:
            out += item.lines.decode().split("\n")[:-1]
    return out
