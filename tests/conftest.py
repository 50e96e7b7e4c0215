"""Shared test parts: real PULL receivers on 127.0.0.1 and the real CLI as a subprocess.

The commands under test are the ones `pip install .` put beside the Python that runs
pytest (README "Development": `.venv/bin/python -m pytest`), run as a user runs them:
by path, through their own #! line.  A session whose installed zmqpush is not this
checkout's stops before any test, saying how to install it.
"""
import fcntl
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import pytest
import zmq
from _pytest.assertion import rewrite

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
ZMQPUSH = str(BIN / "zmqpush.py")
WATERMARK = str(BIN / "zmqpush-watermark.py")
CHECKOUT_ZMQPUSH = str(ROOT / "zmqpush.py")
SINK = str(ROOT / "bench" / "sink.py")
sys.path.insert(0, str(ROOT / "bench"))
from ports import bind_when_free, free_port, release_ports, reservations  # noqa: E402


def installed_differs() -> str:
    """Why the installed commands are not this checkout's, or "" when they are."""
    for command in (ZMQPUSH, WATERMARK):
        if not os.access(command, os.X_OK):
            return f"{command} is not installed"
    module = Path(sysconfig.get_paths()["purelib"]) / "zmqpush.py"
    if not module.is_file() or module.read_bytes() != (ROOT / "zmqpush.py").read_bytes():
        return f"{module} is not the checkout's zmqpush.py"
    installed_tool = Path(WATERMARK).read_bytes().partition(b"\n")[2]
    checkout_tool = (ROOT / "zmqpush-watermark.py").read_bytes().partition(b"\n")[2]
    if installed_tool.replace(b"\nINSTALLED = True\n", b"\nINSTALLED = False\n") != checkout_tool:
        return f"{WATERMARK} is not the checkout's zmqpush-watermark.py"
    return ""


def pytest_configure(config):
    """The commands the tests start get SIGINT at its default action, as a terminal
    user's zmqpush does, however pytest was started.  A process started with SIGINT
    ignored (`pytest ... &` from a shell without job control, nohup) would pass that on
    to every command it starts, and zmqpush keeps a SIGINT ignored at its start ignored
    (README "Exit codes and signals"; omprog starts it so): the tests that send SIGINT
    would then test that set-up instead.  A handler that does nothing keeps this
    process as deaf to SIGINT as it was started, and exec resets a caught signal to its
    default in each child (xdist's workers too: they start with Python's own handler)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, lambda signum, frame: None)


def pytest_sessionstart(session):
    """Stop at once when the tests would run anything but this checkout as installed;
    else, in xdist's controller, warm the rewrite cache for its workers."""
    why = installed_differs()
    if why:
        pytest.exit(f"{why}: run '{sys.executable} -m pip install .' in {ROOT} first",
                    returncode=4)
    if starts_workers(session.config):
        warm_rewrite_cache(session.config)


def starts_workers(config) -> bool:
    """Whether this process is an xdist controller about to start workers (this hook
    runs before xdist's own pytest_sessionstart, which starts them)."""
    return (not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", 0))
            and config.getoption("dist", "no") != "no")


def warm_rewrite_cache(config):
    """Write the assertion-rewritten bytecode of each test module into pytest's own
    cache (tests/__pycache__/*-pytest-*.pyc) unless it is there already, once, before
    the workers start: each worker collects every test module, and on a clean clone
    each would else parse, rewrite and compile them all itself (~3 CPU-s each).  It
    calls what pytest's import hook calls (private functions of pytest 8 and 9), and
    writes nothing where Python may not write bytecode (PYTHONDONTWRITEBYTECODE, -B)
    or assertions are not rewritten (--assert=plain), or where a pytest lacks them;
    a module it cannot read or compile, or that is no regular file (a FIFO would
    block the read), is left to collection, which reports or skips it."""
    private = ("assertstate_key", "get_cache_dir", "PYC_TAIL", "_read_pyc", "try_makedirs",
               "_rewrite_test", "_write_pyc")
    if (sys.dont_write_bytecode or config.getoption("assertmode") != "rewrite"
            or not all(hasattr(rewrite, name) for name in private)):
        return
    state = config.stash[rewrite.assertstate_key]
    for module in sorted(m for m in Path(__file__).parent.glob("test_*.py") if m.is_file()):
        cache = rewrite.get_cache_dir(module)
        pyc = cache / (module.name[:-3] + rewrite.PYC_TAIL)
        if rewrite._read_pyc(module, pyc, state.trace) is None and rewrite.try_makedirs(cache):
            try:
                key, code = rewrite._rewrite_test(module, config)
            except (OSError, SyntaxError, ValueError):  # the worker that collects it says
                continue
            rewrite._write_pyc(state, code, key, pyc)


def run_lock_directory(tmp_path_factory) -> Path:
    """A directory every worker of this pytest run shares (xdist gives each worker its
    own basetemp under one per-run directory; without xdist, the basetemp itself), or
    $ZMQPUSH_TESTS_LOCKS, which pytest runs side by side share (.ci/run)."""
    if os.environ.get("ZMQPUSH_TESTS_LOCKS"):
        return Path(os.environ["ZMQPUSH_TESTS_LOCKS"])
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


class RunLock:
    """The lock every test of a run holds: shared, or exclusive for those marked `alone`,
    which thus run while no other test of this run runs.  The gate, taken briefly by
    every test and held by an `alone` one until it has the lock, keeps new tests from
    starting while an `alone` one waits (flock alone would let shared holders starve
    it).  (Kept from one `alone` test to the next, it could deadlock: an xdist worker
    waits for its next test before it runs the last one it has.)"""

    def __init__(self, directory: Path):
        self._gate = open(directory / "alone.gate", "a+b")
        self._tests = open(directory / "alone.tests", "a+b")

    def take(self, alone: bool):
        """Hold the lock for a test: exclusive if alone, else shared."""
        fcntl.flock(self._gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self._tests, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)

    def release(self):
        fcntl.flock(self._tests, fcntl.LOCK_UN)

    def close(self):
        self._gate.close()
        self._tests.close()


class AlonePhase:
    """The run's `alone` tests come first, as one block: each leaves a mark in a
    directory of this run's own when it has ended (passed, failed or skipped), and an
    ordinary test starts once every `alone` test of the run has left its mark, so the
    `alone` tests never wait for ordinary ones to end.  The wait is bounded
    (MAX_WAIT: a worker that crashed leaves no mark); RunLock alone keeps `alone`
    tests alone whatever the wait did."""

    MAX_WAIT = 600.0

    def __init__(self, directory: Path, alone_tests: list, alone_first: bool):
        run = os.environ.get("PYTEST_XDIST_TESTRUNUID") or str(os.getpid())
        self._marks = directory / f"alone-ended-{run}"
        self._marks.mkdir(exist_ok=True)
        self._names = {self._name(nodeid) for nodeid in alone_tests}
        # Another plugin may have put ordinary tests first (--ff, --nf): then an
        # ordinary test could wait for `alone` ones queued after it, so none waits.
        self._waits = alone_first

    @staticmethod
    def _name(nodeid: str) -> str:
        return hashlib.sha1(nodeid.encode()).hexdigest()

    def ended(self, nodeid: str):
        """Mark the `alone` test nodeid as ended."""
        (self._marks / self._name(nodeid)).touch()

    def wait_until_over(self):
        """Return once every `alone` test of the run has ended (or after MAX_WAIT)."""
        deadline = time.monotonic() + self.MAX_WAIT
        while self._waits and time.monotonic() < deadline:
            if self._names <= set(os.listdir(self._marks)):
                return
            time.sleep(0.1)
        self._waits = False  # waited out once (a crashed worker): no later test here waits


def alone(item) -> bool:
    return item.get_closest_marker("alone") is not None


# Modules whose tests take longest (crash loops, receivers and rsyslogd restarted, a real
# pip install, peak RSS under large inputs: up to 2 minutes each on a loaded machine) go
# first after the `alone` tests, in this order (the module of the longest test first), so
# that they do not end the run alone.
LONGEST_FIRST = ("test_replay.py", "test_confirm_restart.py", "test_readme_commands.py",
                 "test_spool_rsyslog.py", "test_spool.py", "test_memory.py",
                 "test_spool_limits.py", "test_replay_at_end.py")


def pytest_collection_modifyitems(items):
    """The `alone` tests first, in a row (xdist deals them to any worker; their
    exclusive RunLock runs them one after another while the ordinary tests wait in
    AlonePhase), then the longest modules."""
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (not alone(item), rank.get(item.path.name, len(rank))))


@pytest.fixture(scope="session")
def run_lock(tmp_path_factory):
    lock = RunLock(run_lock_directory(tmp_path_factory))
    yield lock
    lock.close()


ALONE_PHASE = pytest.StashKey()


def alone_phase(session) -> AlonePhase:
    """The run's AlonePhase (made on first use: a skipped `alone` test uses no fixture)."""
    if ALONE_PHASE not in session.config.stash:
        alone_tests = [item.nodeid for item in session.items if alone(item)]
        first = all(alone(item) for item in session.items[:len(alone_tests)])
        directory = run_lock_directory(session.config._tmp_path_factory)
        session.config.stash[ALONE_PHASE] = AlonePhase(directory, alone_tests, first)
    return session.config.stash[ALONE_PHASE]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """An `alone` test leaves its mark once it has ended, however it ended."""
    yield
    if alone(item):
        alone_phase(item.session).ended(item.nodeid)


@pytest.fixture(autouse=True)
def alone_or_together(request, run_lock):
    """Every test holds the run's lock (RunLock) from before its other fixtures to after
    the last of them; an ordinary one starts once the `alone` ones have ended."""
    if not alone(request.node):
        alone_phase(request.session).wait_until_over()
    run_lock.take(alone(request.node))
    try:
        yield
    finally:
        run_lock.release()


@pytest.fixture(autouse=True)
def ports_reserved_for_the_test():
    """The ports a test takes with free_port() stay reserved until it ends
    (bench/ports.py says why); those a wider fixture took before it stay longer."""
    mark = reservations()
    yield
    release_ports(mark)



class Receiver:
    """A PULL socket bound on 127.0.0.1 in a thread, keeping every frame it gets;
    setup(sock), if given, runs before it binds (e.g. CURVE options); with
    connect it connects to that endpoint instead of binding."""

    def __init__(self, port: int, setup=None, connect: str = ""):
        self.port = port
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._setup = setup
        self._connect = connect
        self.frames = []
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(15), "receiver did not bind"

    def _run(self):
        sock = zmq.Context.instance().socket(zmq.PULL)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RCVHWM, 1000)
        if self._setup is not None:
            self._setup(sock)
        if self._connect:
            sock.connect(self._connect)
        else:
            bind_when_free(sock, self.endpoint)
        self._ready.set()
        try:
            while not self._stop.is_set():
                if sock.poll(50):
                    while True:
                        try:
                            self.frames.extend(sock.recv_multipart(zmq.NOBLOCK))
                        except zmq.Again:
                            break
        finally:
            sock.close()

    def wait_for(self, count: int, timeout: float = 30.0) -> int:
        """Wait until count frames arrived or timeout; returns the count."""
        deadline = time.monotonic() + timeout
        while len(self.frames) < count and time.monotonic() < deadline:
            time.sleep(0.02)
        return len(self.frames)

    def settle(self, quiet: float = 0.5, timeout: float = 30.0) -> int:
        """Wait until no frame arrived for `quiet` seconds; returns the count."""
        deadline = time.monotonic() + timeout
        last, since = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = len(self.frames)
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since >= quiet:
                break
            time.sleep(0.02)
        return len(self.frames)

    def events(self) -> list:
        """Every frame parsed strictly; arrays are one event per element."""
        out = []
        for frame in self.frames:
            doc = json.loads(frame, strict=True)
            out.extend(doc if isinstance(doc, list) else [doc])
        return out

    def messages(self) -> list:
        return [e["message"] for e in self.events()]

    def stop(self):
        self._stop.set()
        self._thread.join(5)


@pytest.fixture
def receiver():
    r = Receiver(free_port())
    yield r
    r.stop()


@pytest.fixture
def json_parses(monkeypatch) -> list:
    """Every JSON parse zmqpush makes from here on (its _scan_json), as
    (text, where the document starts), in order: a stage test counts them."""
    import zmqpush
    parses, scan = [], zmqpush._scan_json

    def counted(text, at):
        parses.append((text, at))
        return scan(text, at)
    monkeypatch.setattr(zmqpush, "_scan_json", counted)
    return parses


def cli(*args) -> list:
    """The installed zmqpush.py command with args, run by path as a user runs it."""
    return [ZMQPUSH, *args]


def python_script(script: str, *args) -> list:
    """sys.executable running script (-c) isolated (-I): the installed zmqpush module is
    imported, never a zmqpush.py from the current directory."""
    return [sys.executable, "-I", "-c", script, *args]


def run(args, data: bytes = b"", timeout: float = 60, env=None, stdin=None):
    """Run zmqpush.py to completion; returns CompletedProcess with bytes output."""
    kwargs = {"stdin": stdin} if stdin is not None else {"input": data}
    return subprocess.run(cli(*args), capture_output=True, timeout=timeout,
                          env=env_with(env), **kwargs)


def start(args, env=None, **kwargs) -> subprocess.Popen:
    """Start zmqpush.py with stdin a pipe; the caller ends it (see stop_process)."""
    kwargs.setdefault("stdin", subprocess.PIPE)
    kwargs.setdefault("stdout", subprocess.PIPE)
    kwargs.setdefault("stderr", subprocess.PIPE)
    return subprocess.Popen(cli(*args), env=env_with(env), **kwargs)


def env_with(extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ZMQPUSH_")}
    env.update(extra or {})
    return env


def wait_until(condition, timeout: float, step: float = 0.05) -> bool:
    """Whether condition() holds, looked at every step seconds for at most timeout."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(step)
    return condition()


def signal_masks(pid: int) -> dict:
    """The signal masks (SigPnd, SigBlk, SigIgn, SigCgt) of a running process's main thread, as
    ints; {} once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            return {key: int(value, 16) for key, _, value in
                    (line.partition(":") for line in f)
                    if key in ("SigPnd", "SigBlk", "SigIgn", "SigCgt")}
    except FileNotFoundError:
        return {}


def wait_stop_signals_taken(proc: subprocess.Popen, timeout: float = 30.0):
    """Wait until zmqpush's run has its SIGTERM and SIGINT handlers (SIGTERM caught,
    neither blocked): until then the launcher blocks them, and a second one sent
    meanwhile merges with the first."""
    stops = 1 << (signal.SIGTERM - 1) | 1 << (signal.SIGINT - 1)

    def taken() -> bool:
        masks = signal_masks(proc.pid)
        return (not masks or (masks["SigCgt"] & 1 << (signal.SIGTERM - 1)
                and not masks["SigBlk"] & stops))

    assert wait_until(lambda: proc.poll() is not None or taken(), timeout, 0.01), \
        "zmqpush did not take SIGTERM and SIGINT"


def stop_process(proc: subprocess.Popen):
    """End a process this test started, by its PID, if it still runs."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)


def closing_count(stderr: bytes) -> int:
    """N from the closing line 'Processed N messages in X ms. Tagged with @pid:P'."""
    for line in stderr.decode().splitlines():
        if line.startswith("Processed "):
            return int(line.split()[1])
    raise AssertionError(f"no closing line in {stderr!r}")


def vm_peak_rss_kib(pid: int) -> int:
    """VmHWM (peak resident set) of a running process, in KiB."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    raise AssertionError("no VmHWM")


STAMP = re.compile(rb"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (?=zmqpush: )", re.MULTILINE)


def unstamped(text):
    """text (bytes or str) without the time zmqpush writes before each of its
    diagnostics when stderr is neither a terminal nor the journal."""
    if isinstance(text, str):
        return STAMP.sub(b"", text.encode("utf-8", "surrogateescape")).decode(
            "utf-8", "surrogateescape")
    return STAMP.sub(b"", text)
