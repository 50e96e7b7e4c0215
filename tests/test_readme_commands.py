"""Every fenced block of README.md and bench/README.md runs as written, or is listed
here with why it cannot (issue 36).

Each shell command (```sh blocks, one command a line, `\\` continuing it) has an entry
in COMMANDS, each other block one in BLOCKS: a check that runs it, or the reason it
cannot run here.  A block or command without an entry fails the test, so a new one is
run, or explained, before it lands.

What a check changes in a command before it runs it, and only that:
- `zmqpush.py` and `/usr/local/bin/zmqpush.py`: the installed command beside the
  Python that runs pytest (first on PATH); `.venv/bin/` likewise that Python's venv;
- receivers: `tcp://logstash.example:2120`, `tcp://logs.example:2120`,
  `tcp://127.0.0.1:2120` (and zmqpush's default, through `ZMQPUSH_CONNECT`) become
  the test's own PULL socket on 127.0.0.1; a `--bind tcp://*:2120` a free port;
- paths outside the test's own (`/var/log`, `/var/spool/zmqpush`, `/etc/zmqpush`,
  `/var/lib/docker/containers/ID`, `/opt/zmqpush`, `/usr/local/bin/`): a temporary
  directory.
Command 1 (install and try) runs as written in a copy of the checkout, its demo part in
a private network namespace (so its fixed port 2120 is its own).  Command 2 (the tests)
is never run here: it is checked against `.ci/run`.  The rsyslog configuration README
"rsyslog" indents (not fenced) runs in rsyslogd in tests/test_presets.py.
"""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import rsyslog
from test_service import UNIT_JOURNAL, UNIT_PIPELINE

from conftest import BIN, ROOT, ZMQPUSH, env_with, free_port

READMES = ("README.md", "bench/README.md")
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
RECEIVERS = ("tcp://logstash.example:2120", "tcp://logs.example:2120", "tcp://127.0.0.1:2120")


def fenced_blocks(readme: str) -> list:
    """(language, text) of every fenced block of readme, in order."""
    return FENCE.findall((ROOT / readme).read_text())


def shell_commands(text: str) -> list:
    """The commands of a shell block: lines joined where `\\` continues them,
    comment lines and blank lines left out."""
    joined = re.sub(r"\\\n\s*", "", text)
    return [line for line in joined.splitlines() if line.strip() and not line.startswith("#")]


def every_command() -> list:
    """(readme, command) for every shell command but the first block's two."""
    found = []
    for readme in READMES:
        for index, (language, text) in enumerate(fenced_blocks(readme)):
            if language == "sh" and not (readme == "README.md" and index == 0):
                found.extend((readme, command) for command in shell_commands(text))
    return found


def every_other_block() -> list:
    """(readme, text) of every fenced block that is not shell."""
    return [(readme, text) for readme in READMES
            for language, text in fenced_blocks(readme) if language != "sh"]


def block_entry(readme: str, text: str):
    """The BLOCKS entry whose beginning this block starts with."""
    entries = [how for name, beginning, how in BLOCKS
               if name == readme and text.startswith(beginning)]
    assert len(entries) == 1, f"{readme}: no single BLOCKS entry for {text[:80]!r}"
    return entries[0]


# ---------------------------------------------------------------------------------
# Running a command as written, with the substitutions the module docstring lists.

def substituted(command: str, tmp_path: Path, endpoint: str) -> str:
    """command with hosts, ports and outside paths replaced (module docstring)."""
    for host in RECEIVERS:
        command = command.replace(host, endpoint)
    command = command.replace("tcp://*:2120", f"tcp://127.0.0.1:{free_port()}")
    command = command.replace("/usr/local/bin/zmqpush.py", ZMQPUSH)
    command = re.sub(r"(?<![\w/.])\.venv/bin/", f"{BIN}/", command)
    for outside in OUTSIDE:
        command = command.replace(outside, str(inside(tmp_path, outside)))
    return command


def shell_env(command: str, endpoint: str) -> dict:
    """The environment command runs in: the installed command first on PATH; if it
    sends to zmqpush's default endpoint (no -c, no --stdout), ZMQPUSH_CONNECT the
    test's receiver."""
    env = {"PATH": f"{BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
    if not re.search(r" (-c|--bind|--stdout|--make-cert) ", f"{command} "):
        env["ZMQPUSH_CONNECT"] = endpoint
    return env_with(env)


OUTSIDE = ("/var/log", "/var/spool/zmqpush", "/etc/zmqpush", "/var/lib/docker/containers/ID")


def inside(tmp_path: Path, outside: str) -> Path:
    """Where an outside path goes in tmp_path (made if missing)."""
    path = tmp_path / outside.strip("/").replace("/", "_")
    path.mkdir(exist_ok=True)
    return path


def sh(command: str, tmp_path: Path, endpoint: str, timeout: float = 60, **kwargs):
    """Run a substituted command in bash in tmp_path, capturing its output."""
    return subprocess.run(["bash", "-c", substituted(command, tmp_path, endpoint)],
                          capture_output=True, timeout=timeout, cwd=tmp_path,
                          env=shell_env(command, endpoint), **kwargs)


def json_lines(data: bytes) -> list:
    """Every line of data parsed strictly as JSON."""
    return [json.loads(line, strict=True) for line in data.decode().splitlines()]


# ---------------------------------------------------------------------------------
# Checks of shell commands: each gets (command, tmp_path, receiver).

def runs_and_ships(command, tmp_path, receiver):
    """It exits 0 having shipped every line it read to the receiver."""
    done = sh(command, tmp_path, receiver.endpoint, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr
    assert receiver.settle() >= 1 and all(e["type"] for e in receiver.events())


def prints_events(command, tmp_path, receiver):
    """It exits 0 and its stdout is JSON events, one a line."""
    done = sh(command, tmp_path, receiver.endpoint)
    assert done.returncode == 0, done.stderr
    events = json_lines(done.stdout)
    assert events and all("@pid" in event for event in events)
    if "--multiline" in command:
        assert any(event["message"].startswith("Traceback") and "\n" in event["message"]
                   for event in events)


def runs_once(command, tmp_path, receiver):
    """With nothing on stdin it exits 0 (options, files and endpoints accepted)."""
    if "/etc/zmqpush/" in command:  # the key pairs the CURVE commands name
        for name in ("client", "server"):
            made = sh(f"zmqpush.py --make-cert /etc/zmqpush/{name}", tmp_path, receiver.endpoint)
            assert made.returncode == 0, made.stderr
        certs = inside(tmp_path, "/etc/zmqpush")
        (certs / "clients").mkdir()
        shutil.copy(certs / "client.key", certs / "clients")
    done = sh(command, tmp_path, receiver.endpoint, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr


def makes_a_key_pair(command, tmp_path, receiver):
    """It writes NAME.key and NAME.key_secret (mode 600) and says where."""
    done = sh(command, tmp_path, receiver.endpoint)
    assert done.returncode == 0, done.stderr
    name = inside(tmp_path, "/etc/zmqpush") / command.rsplit("/", 1)[1]
    assert Path(f"{name}.key").exists()
    assert os.stat(f"{name}.key_secret").st_mode & 0o777 == 0o600
    assert b"public certificate:" in done.stdout


DOCKER_LINE = b'{"log":"line %d\\n","stream":"stdout","time":"2026-11-27T10:00:00.000000000Z"}\n'


def follows_a_file(command, tmp_path, receiver):
    """A `tail -n0 -F FILE | zmqpush.py ...` pipeline: lines appended to FILE after
    tail opened it are shipped (the test appends one every 0.2 s until the first
    arrives, at most 30 s); then the pipeline is stopped by its process group."""
    path = Path(substituted(re.search(r"-F (\S+)", command)[1], tmp_path, ""))
    path.write_bytes(b"")
    proc = subprocess.Popen(["bash", "-c", substituted(command, tmp_path, receiver.endpoint)],
                            cwd=tmp_path, env=shell_env(command, receiver.endpoint),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    docker = "--docker" in command
    try:
        deadline, n = time.monotonic() + 30, 0
        while not receiver.frames and proc.poll() is None and time.monotonic() < deadline:
            with path.open("ab") as log:
                log.write(DOCKER_LINE % n if docker else b"line %d\n" % n)
            n += 1
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    assert receiver.settle() >= 1, stderr
    assert all(re.fullmatch(r"line \d+", m) for m in receiver.messages())
    if docker:
        assert all(e["stream"] == "stdout" for e in receiver.events())


BENCH_SCRIPT = re.compile(r"^\.venv/bin/python (bench/\w+\.py)(.*)$")


def benchmark_starts(command, tmp_path, receiver):
    """A benchmark names the venv's interpreter and a script that starts (--help)
    and takes every option the command gives it.  The benchmark itself is not run."""
    script, arguments = BENCH_SCRIPT.match(command).groups()
    helped = subprocess.run([sys.executable, str(ROOT / script), "--help"],
                            capture_output=True, timeout=60, cwd=ROOT)
    assert helped.returncode == 0, helped.stderr
    for option in re.findall(r"(?<!\S)(--[a-z][a-z-]*)", arguments):
        assert re.search(rf"(?<![\w-]){option}(?![\w-])", helped.stdout.decode()), option


def installs_the_bench_extra(command, tmp_path, receiver):
    """Not run (it reaches the package index): setup.py has the extra it names."""
    assert "'.[bench]'" in command
    assert re.search(r'"bench": \[', (ROOT / "setup.py").read_text())


COMMANDS = {
    "python3 -m venv /opt/zmqpush && /opt/zmqpush/bin/pip install . && ln -s "
    "/opt/zmqpush/bin/zmqpush.py /opt/zmqpush/bin/zmqpush-watermark.py /usr/local/bin/":
        "test_production_install_as_written",
    "printf 'hello\\n{\"level\":\"info\",\"msg\":\"done\"}\\n' | zmqpush.py app --json --stdout":
        prints_events,
    "seq 1 100 | zmqpush.py -c tcp://logstash.example:2120 app": runs_and_ships,
    "tail -n0 -F /var/log/app.log | zmqpush.py app -c tcp://logstash.example:2120 --spool "
    "/var/spool/zmqpush/app": follows_a_file,
    "zmqpush.py --spool /var/spool/zmqpush -c tcp://127.0.0.1:2120 </dev/null": runs_once,
    "tail -n0 -F /var/lib/docker/containers/ID/ID-json.log | zmqpush.py web --docker "
    "--multiline python": follows_a_file,
    "python3 -c 'import logging; logging.basicConfig(); logging.getLogger().error(\"boom\"); "
    "1/0' 2>&1 | zmqpush.py app --multiline python --stdout": prints_events,
    "zmqpush.py --make-cert /etc/zmqpush/client": makes_a_key_pair,
    "zmqpush.py app -c tcp://logs.example:2120 --curve-server-cert /etc/zmqpush/server.key "
    "--curve-cert /etc/zmqpush/client.key_secret": runs_once,
    "zmqpush.py app --bind tcp://*:2120 --curve-cert /etc/zmqpush/server.key_secret "
    "--curve-clients /etc/zmqpush/clients/": runs_once,
    "zmqpush.py app --bind tcp://*:2120 --allow 10.1.0.0/16 --allow 192.0.2.7": runs_once,
    "python3 -m venv .venv && .venv/bin/pip install -q '.[bench]'": installs_the_bench_extra,
}


def bench_commands() -> list:
    """The commands of bench/README.md's block that runs the benchmarks."""
    return [c for readme, c in every_command() if BENCH_SCRIPT.match(c)]


@pytest.mark.parametrize(("readme", "command"), every_command())
def test_every_command_has_a_check(readme, command):
    assert command in COMMANDS or BENCH_SCRIPT.match(command), \
        f"{readme}: a command with no entry in COMMANDS: {command}"


@pytest.mark.parametrize("command", [c for c, how in COMMANDS.items() if callable(how)])
def test_command_runs_as_written(command, tmp_path, receiver):
    COMMANDS[command](command, tmp_path, receiver)


@pytest.mark.parametrize("command", bench_commands())
def test_each_benchmark_starts(command, tmp_path, receiver):
    benchmark_starts(command, tmp_path, receiver)


def test_every_benchmark_script_has_a_command():
    """Every script bench/README.md says measures something is in its commands."""
    named = {BENCH_SCRIPT.match(c)[1] for c in bench_commands()}
    assert {"bench/throughput.py", "bench/paced.py", "bench/latency.py", "bench/startup.py",
            "bench/pidstat.py", "bench/rsyslog_bench.py", "bench/restart.py",
            "bench/receivers.py", "bench/spool.py", "bench/instructions.py"} <= named


# ---------------------------------------------------------------------------------
# Blocks that are not shell.

def rsyslog_configuration(text: str, tmp_path: Path, receiver) -> None:
    """Each configuration of the block (alternatives are separated by a blank line)
    passes `rsyslogd -N1` with its paths in tmp_path, and each program it names,
    run as omprog runs it (split on spaces) with nothing on stdin, exits 0."""
    assert rsyslog.available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"
    for number, written in enumerate(text.strip().split("\n\n")):
        config = substituted(written, tmp_path, receiver.endpoint)
        path = tmp_path / f"rsyslog-{number}.conf"
        path.write_text(f'global(workDirectory="{tmp_path}")\n{config}\n')
        check = subprocess.run(["rsyslogd", "-N1", "-f", str(path)], capture_output=True,
                               timeout=60)
        assert check.returncode == 0, check.stderr
        programs = re.findall(r'binary="([^"]+)"', config)
        programs += re.findall(r"^\$ActionOMProgBinary (.+)$", config, flags=re.M)
        assert programs
        for program in programs:
            done = subprocess.run(program.split(" "), stdin=subprocess.DEVNULL,
                                  capture_output=True, timeout=60,
                                  env=env_with({"ZMQPUSH_CONNECT": receiver.endpoint}))
            assert done.returncode == 0, (program, done.stderr)
            if "--confirm" in program:
                assert done.stdout == b"OK\n"


def unit_file(text: str, tmp_path: Path, receiver) -> None:
    """tests/test_service.py reads this very unit (systemd-analyze verify, and its
    ExecStart run as systemd runs it on a real journal file)."""
    assert text in (UNIT_JOURNAL, UNIT_PIPELINE)


NO_LOGSTASH = "a Logstash pipeline: no Logstash here (a JVM and logstash-input-zeromq)"
OUTPUT = "what a command prints, or a formula: nothing to run"
BLOCKS = [  # (readme, how the block begins, its check or why it has none)
    ("README.md", 'module(load="omprog")\naction(', rsyslog_configuration),
    ("README.md", 'module(load="omprog")\nruleset(', rsyslog_configuration),
    ("README.md", "[Unit]\nDescription=Ship the systemd journal", unit_file),
    ("README.md", "input { zeromq {", NO_LOGSTASH),
    ("README.md", "zmqpush: read=", OUTPUT),
    ("bench/README.md", "[Unit]\nDescription=Ship the systemd journal", unit_file),
    ("bench/README.md", "--replay-bytes ≥", OUTPUT),
    ("bench/README.md", "zmqpush: refused a client", OUTPUT),
    ("bench/README.md", "output {\n  elasticsearch {", NO_LOGSTASH),
    ("bench/README.md", "# /etc/rsyslog.d/zmqpush-in.conf",
     "needs CURVE certificates and imczmq's receiving side: tests/test_security.py runs "
     "this receiver in rsyslogd"),
    ("bench/README.md", "input {\n", NO_LOGSTASH),
    ("bench/README.md", "zmqpush: read=", OUTPUT),
    ("bench/README.md", "30 MiB (Python", OUTPUT),
]


@pytest.mark.parametrize(("readme", "text"), every_other_block(),
                         ids=lambda v: v if v in READMES else v.splitlines()[0][:40])
def test_every_other_block_is_checked_or_explained(readme, text, tmp_path, receiver):
    how = block_entry(readme, text)
    if callable(how):
        how(text, tmp_path, receiver)
    else:
        assert how  # the reason it cannot run here


# ---------------------------------------------------------------------------------
# The first block: command 1 (install and try) and command 2 (the tests).

def first_block() -> list:
    (language, text), *_ = fenced_blocks("README.md")
    assert language == "sh"
    commands = shell_commands(text)
    assert len(commands) == 2
    return commands


def test_the_test_command_is_what_ci_runs():
    """Command 2 is never run here (it is this suite): its packages are the ones
    .ci/run installs (less debootstrap, for CI's own 3.14 chroot) and its pytest
    command is the one .ci/run runs."""
    _, tests = first_block()
    ci = (ROOT / ".ci" / "run").read_text()
    ci_packages = set(re.search(r"for pkg in (.*?); do", ci, re.S)[1].replace("\\", "").split())
    packages = set(re.search(r"install -y -qq (.*?) &&", tests)[1].split())
    assert packages == ci_packages - {"debootstrap"}
    pytest_command = tests.rsplit(" && ", 1)[1]
    assert pytest_command == ".venv/bin/python -m pytest -q tests"
    assert re.search(rf"^{re.escape(pytest_command)}$", ci, re.M)


def source_copy(tmp_path: Path) -> Path:
    """The files `pip install .` and command 1 use, copied (pip builds in its source
    tree, never the checkout's)."""
    source = tmp_path / "src"
    (source / "bench").mkdir(parents=True)
    for name in ("setup.py", "zmqpush.py", "zmqpush-watermark.py", "README.md", "LICENSE",
                 "bench/sink.py"):
        shutil.copy(ROOT / name, source / name)
    return source


def test_install_and_try_as_written(tmp_path):
    """Command 1 as written, in a copy: the install part with the network, then the
    demo part in a private network namespace (its port 2120 its own)."""
    install, demo = first_block()[0].split(" && { ", 1)
    source = source_copy(tmp_path)
    done = subprocess.run(["bash", "-c", install], cwd=source, capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    done = subprocess.run(["unshare", "--net", "bash", "-c", "ip link set lo up && { " + demo],
                          cwd=source, capture_output=True, timeout=60, env=env_with({}))
    assert done.returncode == 0, done.stderr
    printed = done.stdout.decode().splitlines()
    sent = ["hello", '"quoted"\ttab', "no final newline"]
    assert printed[:3] == [json.dumps(message) for message in sent], printed
    assert printed[3].startswith("received 3 events"), printed


def test_production_install_as_written(tmp_path, receiver):
    """README "Install": the production command with /opt/zmqpush and /usr/local/bin/
    in tmp_path, run in a copy of the checkout; the linked command, found on PATH from
    /, then ships to a receiver, and the linked tool runs."""
    (command,) = [c for c in COMMANDS if COMMANDS[c] == "test_production_install_as_written"]
    assert command in {c for _, c in every_command()}
    bindir = inside(tmp_path, "/usr/local/bin")
    command = command.replace("/opt/zmqpush", str(tmp_path / "opt_zmqpush")).replace(
        "/usr/local/bin/", f"{bindir}/")
    done = subprocess.run(["bash", "-c", command], cwd=source_copy(tmp_path),
                          capture_output=True, timeout=300)
    assert done.returncode == 0, done.stderr
    env = env_with({"PATH": f"{bindir}:/usr/bin:/bin"})
    shipped = subprocess.run(["zmqpush.py", "-c", receiver.endpoint, "prod"], input=b"shipped\n",
                             capture_output=True, timeout=60, env=env, cwd="/")
    assert shipped.returncode == 0, shipped.stderr
    assert receiver.wait_for(1, 10) == 1
    (event,) = receiver.events()
    assert event["message"] == "shipped" and event["type"] == "prod"
    tool = subprocess.run(["zmqpush-watermark.py", "--json", "--sndhwm", "7"],
                          capture_output=True, timeout=60, env=env, cwd="/")
    assert tool.returncode == 0, tool.stderr
    assert json.loads(tool.stdout)["sndhwm"] == 7


def test_no_check_is_left_without_its_command():
    commands = {c for _, c in every_command()}
    assert set(COMMANDS) <= commands, set(COMMANDS) - commands
