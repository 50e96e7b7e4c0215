"""Container logs (--docker, --cri, README "Structured logs"): files the real
writers produced.  Docker's json-file by a private dockerd (Debian's docker.io,
its own data and exec roots and socket, no network, no registry: a busybox
image imported from busybox-static); CRI lines by conmon, the monitor of CRI-O
and podman (Debian's podman, rootful, its storage in a temp directory, its
k8s-file log driver, the same image).  Both run the same shell script; the
stage is also fed directly."""
import asyncio
import fcntl
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import pytest

from conftest import run, run_lock_directory, wait_until

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zmqpush

LONG = 20000  # over dockerd's 16 KiB pieces (conmon's are at most 8 KiB)
# The app's JSON lines; an app "stream" and a valid "@timestamp" of its own.
APP_TIMED = '{"level":"info","msg":"json line","@timestamp":"2026-11-27T10:00:00.000Z"}'
APP_STREAM = '{"level":"warn","msg":"no time","stream":"app"}'
# stdout and stderr, in the order each stream prints them: stderr a Go panic
# with its blank line, a stdout line printed in the middle of it (the pauses
# keep the runtime's copiers, one a stream, writing in that order).
SCRIPT = f"""
echo 'plain line'
echo
head -c {LONG} /dev/zero | tr '\\0' x; echo
yes é | head -n {LONG} | tr -d '\\n'; echo
{{ printf 'x'; yes é | head -n {LONG} | tr -d '\\n'; echo; }} > /odd; cat /odd
echo '{APP_TIMED}'
echo '{APP_STREAM}'
echo 'panic: oops' >&2
echo >&2
echo 'goroutine 1 [running]:' >&2
sleep 0.2
echo 'between the trace lines'
sleep 0.2
echo 'main.main()' >&2
printf '\\t/app/main.go:5 +0x1d\\n' >&2
printf 'last line, no newline'
"""
TRACE = "panic: oops\n\ngoroutine 1 [running]:\nmain.main()\n\t/app/main.go:5 +0x1d"
STDOUT = ["plain line", "", "x" * LONG, "é" * LONG, "x" + "é" * LONG, APP_TIMED, APP_STREAM,
          "between the trace lines", "last line, no newline"]
STDERR = TRACE.split("\n")
DOCKER = "/usr/bin/docker"
PODMAN = "/usr/bin/podman"
PIECE = 16384  # dockerd's piece size
CONMON_BUFFER = 8192  # conmon's read buffer: its pieces' most


def stdout_of(runtime: str) -> list:
    """STDOUT as the runtime keeps it: dockerd cuts pieces inside a UTF-8
    character and its JSON writes each piece's broken ends as U+FFFD (lost
    before zmqpush reads them); CRI keeps the bytes, and zmqpush joins them."""
    if runtime == "cri":
        return STDOUT
    odd = ("x" + "é" * LONG).encode()
    pieces = [odd[at:at + PIECE].decode("utf-8", "replace") for at in range(0, len(odd), PIECE)]
    return [m if not m.startswith("xé") else "".join(pieces) for m in STDOUT]


def busybox_image(path: Path):
    """A tar of busybox-static and the applets SCRIPT runs: `docker import` makes
    an image of it, no registry needed."""
    root = path / "image"
    (root / "bin").mkdir(parents=True)
    shutil.copy("/bin/busybox", root / "bin" / "busybox")
    for applet in ("sh", "echo", "printf", "head", "tr", "yes", "sleep", "cat"):
        os.symlink("busybox", root / "bin" / applet)
    with tarfile.open(path / "image.tar", "w") as tar:
        tar.add(root, arcname=".")
    return path / "image.tar"


def docker(sock: Path, *args, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([DOCKER, "-H", f"unix://{sock}", *args], capture_output=True,
                          timeout=timeout, check=True)


def written_once(tmp_path_factory, name: str, write) -> bytes:
    """The file write(directory) returns, written once for the whole run (every
    xdist worker takes the first one's): one dockerd and one podman run a run."""
    shared = run_lock_directory(tmp_path_factory)
    path = shared / f"container-{name}.log"
    with open(shared / f"container-{name}.lock", "a+b") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not path.exists():
            data = write(tmp_path_factory.mktemp(name))
            path.with_suffix(".part").write_bytes(data)
            path.with_suffix(".part").rename(path)
        return path.read_bytes()


@pytest.fixture(scope="module")
def docker_log(tmp_path_factory) -> bytes:
    """SCRIPT's output as a private dockerd's json-file driver wrote it."""
    return written_once(tmp_path_factory, "docker", dockerd_writes)


@pytest.fixture(scope="module")
def cri_log(tmp_path_factory) -> bytes:
    """SCRIPT's output as conmon wrote it (pieces of at most 8 KiB: its read buffer)."""
    return written_once(tmp_path_factory, "cri", podman_writes)


def dockerd_writes(base: Path) -> bytes:
    """SCRIPT run in a container of a private dockerd: its json-file log."""
    sock = base / "docker.sock"
    log = (base / "dockerd.log").open("wb")
    daemon = subprocess.Popen(
        ["dockerd", "--data-root", str(base / "data"), "--exec-root", str(base / "exec"),
         "-H", f"unix://{sock}", "--pidfile", str(base / "docker.pid"), "--iptables=false",
         "--ip-masq=false", "--ip-forward=false", "--bridge=none"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        assert wait_until(lambda: subprocess.run(
            [DOCKER, "-H", f"unix://{sock}", "info"], capture_output=True).returncode == 0
            or daemon.poll() is not None, 60) and daemon.poll() is None, \
            (base / "dockerd.log").read_text(errors="replace")[-2000:]
        docker(sock, "import", str(busybox_image(base)), "zmqpush-busybox:test")
        docker(sock, "run", "--name", "zmqpush-test", "--network", "none",
               "zmqpush-busybox:test", "/bin/sh", "-c", SCRIPT)
        [path] = (base / "data" / "containers").glob("*/*-json.log")
        data = path.read_bytes()
        docker(sock, "rm", "zmqpush-test")
        return data
    finally:
        daemon.terminate()
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


def succeeds(command: list, env: dict):
    """Run command; fail with its stderr if it fails."""
    result = subprocess.run(command, capture_output=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-2000:]


def podman_writes(base: Path) -> bytes:
    """SCRIPT run in a container of podman (rootful, its storage, run and temp
    directories in a directory of /tmp, removed after: podman refuses a run root
    over 50 characters): conmon's k8s-file log, the CRI format."""
    storage, log = Path(tempfile.mkdtemp(prefix="zmqpush-podman-", dir="/tmp")), base / "0.log"
    podman = [PODMAN, "--root", str(storage / "root"), "--runroot", str(storage / "run"),
              "--tmpdir", str(storage / "tmp"), "--network-config-dir", str(storage / "net"),
              "--storage-driver", "vfs", "--cgroup-manager", "cgroupfs",
              "--events-backend", "file"]
    env = {**os.environ, "TMPDIR": str(base)}
    try:
        succeeds([*podman, "import", str(busybox_image(base)), "zmqpush-busybox:test"], env)
        # podman's default limits (nofile 1048576, nproc 4194304) can be over the hard
        # limits where the tests run: runc cannot set them
        succeeds([*podman, "run", "--rm", "--network", "none", "--ulimit", "nofile=1024:1024",
                  "--ulimit", "nproc=1024:1024",
                  "--log-driver", "k8s-file", "--log-opt", f"path={log}",
                  "zmqpush-busybox:test", "/bin/sh", "-c", SCRIPT], env)
        return log.read_bytes()
    finally:
        shutil.rmtree(storage, ignore_errors=True)


def ship(receiver, data: bytes, *args, expected: int) -> list:
    """Run zmqpush.py on data with args; the events the receiver got."""
    result = run(["-c", receiver.endpoint, "-q", *args, "app"], data)
    assert result.returncode == 0, result.stderr
    assert wait_until(lambda: len(receiver.events()) >= expected, 30)
    receiver.settle(0.3)
    return receiver.events()


def by_stream(events: list) -> dict:
    """The events' messages per stream, in order."""
    out: dict = {}
    for event in events:
        out.setdefault(event["stream"], []).append(event["message"])
    return out


def entry_times(runtime: str, data: bytes) -> dict:
    """Per stream, the runtime's times of the entries that begin a line."""
    times, partial = {}, {}
    for line in data.splitlines():
        if runtime == "docker":
            entry = json.loads(line)
            stream, when, done = entry["stream"], entry["time"], entry["log"].endswith("\n")
        else:
            when, stream, tag = line.split(b" ", 3)[:3]
            stream, when, done = stream.decode(), when.decode(), tag == b"F"
        if not partial.get(stream):
            times.setdefault(stream, []).append(when)
        partial[stream] = not done
    return times


@pytest.fixture(params=["docker", "cri"])
def written(request) -> tuple:
    """(runtime, the file its real writer wrote)."""
    return request.param, request.getfixturevalue(f"{request.param}_log")


def test_the_writers_split_long_lines_and_keep_blank_ones(docker_log, cri_log):
    """What the tests below rely on: the files hold pieces and blank lines."""
    docker_lines = [json.loads(line) for line in docker_log.splitlines()]
    assert any({"log": "\n", "stream": "stdout"}.items() <= entry.items()
               for entry in docker_lines)  # the two streams' order is dockerd's
    assert any(len(entry["log"]) == 16384 and not entry["log"].endswith("\n")
               for entry in docker_lines)
    cri_lines = [line.split(b" ", 3) for line in cri_log.splitlines()]
    assert [b"stdout", b"F", b""] in [parts[1:] for parts in cri_lines]
    assert max(len(parts[3]) for parts in cri_lines) <= CONMON_BUFFER  # its read buffer
    assert sum(parts[1:3] == [b"stdout", b"P"] for parts in cri_lines) >= 2 + 4 + 4  # LONG, 2 LONG
    # the x-then-é line written at once (cat): conmon reads it in whole pipe pages, an
    # even number of bytes, so its cuts fall inside characters
    assert any(parts[2] == b"P" and parts[3].endswith(b"\xc3") for parts in cri_lines)
    assert [parts for parts in cri_lines if parts[1] == b"stdout"][-1][2:] == \
        [b"P", b"last line, no newline"]  # no newline: no F ever
    for data in (docker_log, cri_log):  # the stdout line between the trace's lines
        goroutine, between, main = (data.index(text) for text in (
            b"goroutine 1", b"between the trace", b"main.main()"))
        assert goroutine < between < main


def test_each_line_one_event_message_without_newline_stream_and_time(receiver, written):
    runtime, data = written
    events = ship(receiver, data, f"--{runtime}", expected=len(STDOUT) + len(STDERR))
    assert by_stream(events) == {"stdout": stdout_of(runtime), "stderr": STDERR}
    times = {}
    for event in events:
        times.setdefault(event["stream"], []).append(event["@timestamp"])
        assert event["type"] == "app" and "tags" not in event
    assert times == entry_times(runtime, data)


def test_multiline_joins_per_stream(receiver, written):
    runtime, data = written
    events = ship(receiver, data, f"--{runtime}", "--multiline", "go",
                  expected=len(STDOUT) + 1)
    assert by_stream(events) == {"stdout": stdout_of(runtime), "stderr": [TRACE]}


def test_json_on_top_merges_the_apps_objects(receiver, written):
    runtime, data = written
    events = ship(receiver, data, f"--{runtime}", "--json", "--json-message-key", "msg",
                  expected=len(STDOUT) + len(STDERR))
    timed = next(e for e in events if e.get("level") == "info")
    assert timed["message"] == "json line" and timed["stream"] == "stdout"
    assert timed["@timestamp"] == "2026-11-27T10:00:00.000Z"
    assert zmqpush.iso8601_time(timed["@runtime_time"])
    other = next(e for e in events if e.get("level") == "warn")
    assert other["@json_replaced"] == {"stream": "app"} and other["stream"] == "stdout"
    assert other["message"] == "no time" and zmqpush.iso8601_time(other["@timestamp"])
    text = [e for e in events if e.get("level") is None]
    assert len(text) == len(STDOUT) + len(STDERR) - 2
    assert all(e["tags"] == ["_jsonparsefailure"] and e["@json_error"] for e in text)
    assert [e["message"] for e in text if e["stream"] == "stdout"] == \
        [m for m in stdout_of(runtime) if not m.startswith("{")]


def test_a_joined_line_over_max_line_bytes_leaves_in_marked_pieces(receiver, written):
    runtime, data = written
    events = ship(receiver, data, f"--{runtime}", "--max-line-bytes", "8192",
                  expected=len(STDOUT) + len(STDERR) + 9)
    stdout = [e for e in events if e["stream"] == "stdout"]
    xs = [e for e in stdout if e["message"].startswith("xx")]
    assert [len(e["message"]) for e in xs] == [8192, 8192, LONG - 2 * 8192]
    assert [e.get("@continues", False) for e in xs] == [True, True, False]
    pieces = [e for e in stdout if "é" in e["message"]]
    assert all(len(e["message"].encode()) <= 8192 for e in pieces)
    joined, run = [], ""
    for event in pieces:
        run += event["message"]
        if not event.get("@continues"):
            joined.append(run)
            run = ""
    assert joined == [m for m in stdout_of(runtime) if "é" in m]


def test_lines_that_are_not_entries_are_marked_and_kept(receiver, written):
    runtime, data = written
    bad = [b"not an entry", b'{"log":1,"stream":"stdout","time":"x"}', b"\xff\xfe", b""]
    lines = data.splitlines(keepends=True)
    mixed = b"".join(lines[:2]) + b"".join(b + b"\n" for b in bad) + b"".join(lines[2:])
    events = ship(receiver, mixed, f"--{runtime}",
                  expected=len(STDOUT) + len(STDERR) + len(bad))
    marked = [e for e in events if "stream" not in e]
    assert [e["message"] for e in marked] == [b.decode("utf-8", "replace") for b in bad]
    assert all(e["tags"] == ["_jsonparsefailure"] and "@json_error" in e for e in marked)
    assert by_stream([e for e in events if "stream" in e]) == \
        {"stdout": stdout_of(runtime), "stderr": STDERR}


@pytest.mark.parametrize("extra", [["--batch"], ["--spool", "SPOOL"]])
def test_batch_and_spool_compose(receiver, written, extra, tmp_path):
    runtime, data = written
    extra = [str(tmp_path / "spool") if arg == "SPOOL" else arg for arg in extra]
    events = ship(receiver, data, f"--{runtime}", "--multiline", "go", *extra,
                  expected=len(STDOUT) + 1)
    assert extra[0] != "--batch" or len(receiver.frames) < len(events)
    assert by_stream(events) == {"stdout": stdout_of(runtime), "stderr": [TRACE]}


def test_confirm_answers_every_line_once(receiver, written):
    """--confirm: one "OK" per line read (pieces held are answered at once),
    and every event arrives."""
    runtime, data = written
    result = run(["-c", receiver.endpoint, "-q", "--confirm", f"--{runtime}",
                  "--multiline", "go", "app"], data)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\n")[:-1] == [b"OK"] * (data.count(b"\n") + 1)
    assert receiver.wait_for(len(STDOUT) + 1, 30) >= len(STDOUT) + 1
    receiver.settle(0.3)
    assert by_stream(receiver.events()) == {"stdout": stdout_of(runtime), "stderr": [TRACE]}


def long_entries(runtime: str) -> bytes:
    """A 20,000-byte line as one entry, then as pieces of 16 KiB (Docker's)."""
    line = "z" * 20000
    pieces = [line[:16384], line[16384:]]
    if runtime == "docker":
        return docker_line(line + "\n") + b"".join(
            docker_line(p + "\n" * (i == 1)) for i, p in enumerate(pieces))
    when = b"2026-11-27T10:00:00.1Z stdout "
    return (when + b"F " + line.encode() + b"\n" + when + b"P " + pieces[0].encode() + b"\n"
            + when + b"F " + pieces[1].encode() + b"\n")


@pytest.mark.parametrize("extra", [[], ["--multiline", "go"]])
@pytest.mark.parametrize("runtime", ["docker", "cri"])
def test_confirm_answers_once_a_line_cut_in_pieces(receiver, runtime, extra):
    """An entry over --max-line-bytes leaves in pieces; its line gets one reply."""
    data = long_entries(runtime)
    result = run(["-c", receiver.endpoint, "-q", "--confirm", f"--{runtime}",
                  "--max-line-bytes", "8192", *extra, "app"], data)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\n")[:-1] == [b"OK"] * (data.count(b"\n") + 1)
    assert receiver.wait_for(6, 30) >= 6
    receiver.settle(0.3)
    events = receiver.events()
    assert [len(e["message"]) for e in events] == [8192, 8192, 3616] * 2
    assert [e.get("@continues", False) for e in events] == [True, True, False] * 2


# ------------------------------------------------------------------ stage --

def unwrapping(runtime="docker", max_line_bytes=64 << 10, clock=lambda: 0.0, **kwargs):
    return zmqpush.Unwrapping(runtime, max_line_bytes, zmqpush.Counters(), clock=clock,
                              **kwargs)


def events_of(items: list) -> list:
    out = []
    for item in items:
        out += [json.loads(line) for line in item.lines.split(b"\n")[:-1]]
    return out


def docker_line(log: str, stream: str = "stdout", when: str = "2026-11-27T10:00:00.1Z") -> bytes:
    return json.dumps({"log": log, "stream": stream, "time": when}).encode() + b"\n"


def test_stage_joins_docker_pieces_per_stream_and_holds_them():
    stage = unwrapping(keep_raw=True)
    first = docker_line("ab", when="2026-11-27T10:00:00.1Z")
    assert stage.feed([zmqpush.Segment(first)]) == []
    assert stage.held() == 1 and stage.holding() == [first[:-1]]
    out = stage.feed([zmqpush.Segment(docker_line("err\n", "stderr") + docker_line(
        "cd\n", when="2026-11-27T10:00:00.2Z"))])
    assert [(e["message"], e["stream"], e["@timestamp"]) for e in events_of(out)] == [
        ("err", "stderr", "2026-11-27T10:00:00.1Z"),
        ("abcd", "stdout", "2026-11-27T10:00:00.1Z")]
    assert stage.held() == 0 and stage.deadline() is None


def test_stage_joins_cri_pieces_as_bytes():
    """A piece may end inside a UTF-8 character: joined as bytes, decoded once."""
    text = "é".encode()
    stage = unwrapping("cri")
    out = stage.feed([zmqpush.Segment(b"2026-11-27T10:00:00.1Z stdout P a" + text[:1] + b"\n"
                                      + b"2026-11-27T10:00:00.2Z stdout F " + text[1:] + b"\n")])
    assert [e["message"] for e in events_of(out)] == ["aé"]


def test_stage_releases_a_quiet_partial_entry():
    now = [0.0]
    stage = unwrapping(clock=lambda: now[0])
    assert stage.feed([zmqpush.Segment(docker_line("no newline"))]) == []
    assert stage.deadline() == zmqpush.CONTAINER_PARTIAL_QUIET
    assert stage.flush_due(0.5) == []
    assert [e["message"] for e in events_of(stage.flush_due(1.0))] == ["no newline"]
    assert stage.held() == 0


def test_stage_keeps_an_invalid_app_timestamp():
    counters = zmqpush.Counters()
    stage = zmqpush.Unwrapping("docker", 1 << 16, counters, app_json=True)
    out = stage.feed([zmqpush.Segment(docker_line('{"@timestamp":"yesterday"}\n'))])
    [event] = events_of(out)
    assert event["_@timestamp"] == "yesterday"
    assert event["@timestamp"] == "2026-11-27T10:00:00.1Z" and "@json_error" in event
    assert counters.json_fixed == 1


def test_stage_keeps_every_app_value_its_keys_replace_one_level_down():
    """The app's own "stream", "@runtime_time" and "@json_error" under
    "@json_replaced", beside the encoder's (type), not nested in it."""
    stage = zmqpush.Unwrapping("docker", 1 << 16, zmqpush.Counters(), app_json=True)
    app = ('{"@timestamp":"2021-01-01T00:00:00Z","@runtime_time":"APP","stream":"S",'
           '"@json_error":"E","@metadata":"m"}\n')
    [event] = events_of(stage.feed([zmqpush.Segment(docker_line(app))]))
    assert event["@timestamp"] == "2021-01-01T00:00:00Z" and event["stream"] == "stdout"
    assert event["@runtime_time"] == "2026-11-27T10:00:00.1Z"
    assert event["@json_replaced"] == {"@runtime_time": "APP", "stream": "S", "@json_error": "E"}
    app_type = zmqpush.merged_event({**event, "type": "APPTYPE"}, {"type": "t"}, False)
    assert app_type["@json_replaced"] == {**event["@json_replaced"], "type": "APPTYPE"}


def test_stage_marks_what_json_cannot_carry():
    """A lone surrogate in "log" cannot be sent as UTF-8: its message is repaired."""
    out = unwrapping().feed([zmqpush.Segment(b'{"log":"a\\ud800b\\n","stream":"stdout",'
                                             b'"time":"2026-11-27T10:00:00Z"}\n')])
    [event] = events_of(out)
    assert event["message"] == "a\ufffd\ufffd\ufffdb" and event["@json_error"] == "lone surrogate"


def test_stage_passes_pieces_of_an_over_long_envelope():
    stage = unwrapping()
    piece = zmqpush.Segment(b"x" * 10 + b"\n", strip_cr=False, continues=True)
    rest = zmqpush.Segment(b"tail\n" + docker_line("ok\n"))
    out = stage.feed([piece, rest])
    assert out[0] is piece and out[1].lines == b"tail\n"
    assert [e["message"] for e in events_of(out[2:])] == ["ok"]


def test_options():
    base = ["--docker", "--multiline", "go"]
    config = zmqpush.parse_options(base, environ={})
    assert config.container == "docker" and config.multiline.sources == ("stream",)
    assert zmqpush.parse_options([], environ={"ZMQPUSH_CRI": "1"}).container == "cri"
    for bad in (["--docker", "--cri"], ["--cri", "--journal"], ["--docker", "--timestamp"],
                ["--cri", "-f", "stream=x"]):
        with pytest.raises(zmqpush.UsageError):
            zmqpush.parse_options(bad, environ={})


def test_timer_releases_a_partial_entry_while_input_stays_open(receiver):
    """A runtime that dies mid-line leaves a partial entry: it leaves after
    CONTAINER_PARTIAL_QUIET, with stdin still open."""
    from conftest import cli, stop_process
    proc = subprocess.Popen(cli("-c", receiver.endpoint, "-q", "--docker", "app"),
                            stdin=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        proc.stdin.write(docker_line("unfinished"))
        proc.stdin.flush()
        began = time.monotonic()
        assert receiver.wait_for(1, 30) == 1
        assert time.monotonic() - began >= zmqpush.CONTAINER_PARTIAL_QUIET * 0.9
        assert receiver.messages() == ["unfinished"]
    finally:
        proc.stdin.close()
        stop_process(proc)


@pytest.mark.parametrize("app_json", [False, True])
def test_each_envelope_parsed_once_and_the_apps_json_once_more(json_parses, app_json):
    """--docker --multiline (and --json): the stage's parses are the joiner's
    and the encoder's, a joined event's first line's too (kept while the
    event is pending)."""
    app = [json.dumps({"n": n, "message": f"line {n}"}) for n in range(3000)]
    lines = ([docker_line(text + "\n") for text in app[:10]]
             + [docker_line(text + "\n", "stderr") for text in STDERR]
             + [docker_line(text + "\n") for text in app[10:]])

    async def go():
        sink = zmqpush.ByteQueue(1 << 30)
        config = zmqpush.parse_options(["--docker", "--multiline", "go"]
                                       + ["--json"] * app_json, environ={})
        encoder = zmqpush.JsonEncoder(b"t", 1, batch=False)
        pipeline = zmqpush.build_pipeline(config, sink, encoder=encoder,
                                          counters=zmqpush.Counters(), replies=None)
        await pipeline.feed(b"".join(lines), 0.0)
        await pipeline.finish()
        out = []
        while not sink.empty():
            parcel = sink.get_nowait()
            if parcel is not zmqpush.END:
                out += [json.loads(m)["message"] for m in parcel.messages]
        return out
    messages = asyncio.run(go())
    assert len(b"".join(lines)) > zmqpush.JSON_RUN_BYTES
    assert messages == [f"line {n}" if app_json else app[n] for n in range(3000)] + [TRACE]
    assert len(json_parses) == len(lines) * (1 + app_json)


def test_stage_keeps_docker_attrs_and_the_apps_own_under_replaced():
    attrs = {"tag": "web", "env": "prod"}
    line = json.dumps({"log": '{"attrs":1,"a":2}\n', "stream": "stdout", "attrs": attrs,
                       "time": "2026-11-27T10:00:00.1Z"}).encode() + b"\n"
    [plain] = events_of(unwrapping().feed([zmqpush.Segment(line)]))
    assert plain["attrs"] == attrs and plain["message"] == '{"attrs":1,"a":2}'
    [app] = events_of(unwrapping(app_json=True).feed([zmqpush.Segment(line)]))
    assert app["attrs"] == attrs and app["a"] == 2
    assert app[zmqpush.REPLACED_KEY] == {"attrs": 1}


@pytest.mark.parametrize("pieces, message", [
    (["tty\r\n"], "tty"), (["tty", "\r\n"], "tty"), (["tty\r", "\n"], "tty"),
    (["tty\r\r\n"], "tty\r"), (["tty\r"], "tty\r")])
def test_stage_drops_one_cr_before_a_docker_newline_as_cri_does(pieces, message):
    stage = unwrapping()
    out = stage.feed([zmqpush.Segment(b"".join(docker_line(p) for p in pieces))])
    assert [e["message"] for e in events_of(out + stage.flush())] == [message]
    cri = unwrapping("cri").feed([zmqpush.Segment(
        b"2026-11-27T10:00:00.1Z stdout F " + message.encode() + b"\r\n")])
    assert message == "tty\r" or [e["message"] for e in events_of(cri)] == [message]


def test_stage_cuts_a_line_that_is_not_an_entry_at_max_line_bytes():
    """Its pieces marked @continues, held lines but the last (one reply with --confirm)."""
    counters = zmqpush.Counters()
    stage = zmqpush.Unwrapping("cri", 8, counters)
    text = "abcdé" * 4 + "\ufffd"
    [item] = stage.feed([zmqpush.Segment(text.encode()[:-3] + b"\xff\n")])
    events = events_of([item])
    assert all(len(e["message"].encode()) <= 8 for e in events)
    assert "".join(e["message"] for e in events) == text
    assert [e.get("@continues", False) for e in events] == [True] * 3 + [False]
    assert all(e["tags"] == ["_jsonparsefailure"] for e in events)
    assert item.held == 3 and counters.json_failures == 1


@pytest.mark.parametrize("runtime, size, limit", [("cri", 5000, 1000),
                                                  ("docker", 300000, None)])
def test_a_line_that_is_not_an_entry_leaves_in_pieces_within_max_line_bytes(
        receiver, runtime, size, limit):
    limit_args = ["--max-line-bytes", str(limit)] if limit else []
    line = bytes(range(48, 58)) * (size // 10)
    data = line + b"\n" + docker_line("after\n") if runtime == "docker" else \
        line + b"\n2026-11-27T10:00:00.1Z stdout F after\n"
    result = run(["-c", receiver.endpoint, "-q", "--confirm", f"--{runtime}", *limit_args,
                  "app"], data)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\n")[:-1] == [b"OK"] * 3
    limit = limit or zmqpush.DEFAULT_MAX_LINE_BYTES
    pieces = -(-size // limit)
    assert receiver.wait_for(pieces + 1, 30) >= pieces + 1
    receiver.settle(0.3)
    events = receiver.events()
    assert [e["message"] for e in events[pieces:]] == ["after"]
    assert all(len(e["message"]) <= limit for e in events)
    assert "".join(e["message"] for e in events[:pieces]) == line.decode()
    assert [e.get("@continues", False) for e in events[:pieces]] == [True] * (pieces - 1) + [False]
