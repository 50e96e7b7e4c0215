"""Issue 28: running as a service. systemd's notify protocol (READY=1, STATUS=,
STOPPING=1, WATCHDOG=1) received on a datagram socket the test binds, as systemd's
own is; the --metrics-file read with prometheus_client's parser; the unit files
checked by systemd-analyze and their command lines run as systemd runs them."""
import http.client
import os
import shlex
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from rsyslog import PrivateRsyslog, available
from test_rsyslog import binary, omprog, wait_children
from test_shipping import main_thread_wakeups
from test_structured import BOOT_ID, FIRST_MICROS, JOURNAL_REMOTE, export_entry

from conftest import ROOT, ZMQPUSH, Receiver, free_port, start, stop_process


@pytest.fixture(autouse=True)
def _outside_any_unit(monkeypatch):
    """The tests say themselves which of systemd's variables zmqpush gets: none
    comes from a unit that runs the tests."""
    for name in ("NOTIFY_SOCKET", "SYSTEMD_EXEC_PID", "WATCHDOG_PID", "WATCHDOG_USEC"):
        monkeypatch.delenv(name, raising=False)


class NotifyReceiver:
    """An AF_UNIX datagram socket bound where NOTIFY_SOCKET will point (a path in
    a short temporary directory, or an abstract name), keeping every message
    with the time it came, read in a thread."""

    def __init__(self, abstract: bool = False):
        self._directory = None
        if abstract:
            self.address = "@zmqpush-test-" + uuid.uuid4().hex
            bound = "\0" + self.address[1:]
        else:
            self._directory = tempfile.mkdtemp(prefix="zn", dir="/tmp")
            self.address = bound = os.path.join(self._directory, "notify")
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        self._sock.bind(bound)
        self._sock.settimeout(0.05)
        self.messages = []  # (monotonic time, text)
        self.senders = []  # (text, the sender's pid as the kernel tells it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                data, ancillary, _, _ = self._sock.recvmsg(65536, socket.CMSG_SPACE(12))
            except socket.timeout:
                continue
            pid = next((struct.unpack("3i", payload)[0] for level, kind, payload in ancillary
                        if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS),
                       None)
            self.senders.append((data.decode(), pid))
            self.messages.append((time.monotonic(), data.decode()))

    def texts(self) -> list:
        return [text for _, text in self.messages]

    def wait_for(self, predicate, timeout: float = 10.0):
        """The first message text predicate accepts, waiting up to timeout; else None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for text in self.texts():
                if predicate(text):
                    return text
            time.sleep(0.02)
        return None

    def pings(self) -> list:
        """The times WATCHDOG=1 came."""
        return [when for when, text in self.messages if text == "WATCHDOG=1"]

    def close(self):
        self._stop.set()
        self._thread.join(5)
        self._sock.close()
        if self._directory is not None:
            shutil.rmtree(self._directory, ignore_errors=True)


@pytest.fixture
def notify():
    n = NotifyReceiver()
    yield n
    n.close()


def status_with(*parts):
    return lambda text: text.startswith("STATUS=") and all(p in text for p in parts)


def test_ready_status_and_stopping_reach_the_notify_socket(receiver, notify):
    proc = start(["-c", receiver.endpoint, "app"], env={"NOTIFY_SOCKET": notify.address})
    try:
        ready = notify.wait_for(lambda text: text.startswith("READY=1\n"))
        assert ready == "READY=1\nSTATUS=0 read, 0 sent, 0 queued, 0 dropped, " \
            "0 receivers connected", notify.texts()
        proc.stdin.write(b"one\ntwo\nthree\n")
        proc.stdin.flush()
        assert receiver.wait_for(3, 10) == 3
        assert notify.wait_for(status_with("3 read, 3 sent", "1 receivers connected"))
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    texts = notify.texts()
    stopping = [t for t in texts if t.startswith("STOPPING=1\n")]
    assert stopping == ["STOPPING=1\nSTATUS=stopping: 0 events not yet handed to ZeroMQ, "
                        "lingering up to 4 s"], texts
    assert texts.index(ready) < texts.index(stopping[0])
    assert not any(t.startswith("WATCHDOG=") for t in texts)  # WATCHDOG_USEC unset


def test_an_abstract_notify_socket_name_is_reached(receiver):
    notify = NotifyReceiver(abstract=True)
    try:
        proc = start(["-c", receiver.endpoint], env={"NOTIFY_SOCKET": notify.address})
        try:
            assert notify.wait_for(lambda text: text.startswith("READY=1\n"))
            proc.stdin.close()
            assert proc.wait(10) == 0
        finally:
            stop_process(proc)
        assert notify.wait_for(lambda text: text.startswith("STOPPING=1\n"), 2)
    finally:
        notify.close()


def test_a_notify_socket_nobody_reads_is_said_once_and_the_run_goes_on(receiver):
    missing = f"/tmp/zmqpush-no-such-socket-{uuid.uuid4().hex}"
    proc = start(["-c", receiver.endpoint], env={"NOTIFY_SOCKET": missing})
    try:
        proc.stdin.write(b"a\nb\n")
        proc.stdin.close()
        assert proc.wait(10) == 0
        err = proc.stderr.read().decode()
    finally:
        stop_process(proc)
    assert receiver.wait_for(2) == 2
    assert err.count("cannot notify systemd") == 1, err
    assert f"zmqpush: cannot notify systemd at NOTIFY_SOCKET={missing}: " in err


def test_watchdog_pings_every_half_interval_and_stop_while_the_process_is_stopped(
        receiver, notify):
    proc = start(["-c", receiver.endpoint],
                 env={"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "200000"})
    try:
        assert notify.wait_for(lambda text: text.startswith("READY=1\n"))
        time.sleep(1.0)
        pings = notify.pings()
        assert len(pings) >= 4, notify.texts()
        gaps = sorted(b - a for a, b in zip(pings, pings[1:]))
        assert gaps[0] >= 0.08, gaps  # half of 200 ms: not more often,
        assert gaps[len(gaps) // 2] < 0.15, gaps  # and not at the full interval
        os.kill(proc.pid, signal.SIGSTOP)
        time.sleep(0.3)  # a ping sent just before the stop arrives
        stopped_at = len(notify.pings())
        time.sleep(1.0)
        assert len(notify.pings()) == stopped_at  # a stopped loop pings no more
        os.kill(proc.pid, signal.SIGCONT)
        deadline = time.monotonic() + 5
        while len(notify.pings()) == stopped_at and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(notify.pings()) > stopped_at  # and pings again once it turns
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_no_pings_when_watchdog_pid_names_another_process(receiver, notify):
    """As sd_watchdog_enabled(3): WATCHDOG_PID, when set, must be our own pid."""
    proc = start(["-c", receiver.endpoint],
                 env={"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "200000",
                      "WATCHDOG_PID": str(os.getpid())})
    try:
        assert notify.wait_for(lambda text: text.startswith("READY=1\n"))
        time.sleep(1.0)
        assert notify.pings() == []
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_idle_with_notify_and_metrics_file_the_main_thread_never_wakes(receiver, notify,
                                                                        tmp_path):
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-q", "-c", receiver.endpoint, "--metrics-file", str(metrics),
                  "--metrics-listen", f"127.0.0.1:{free_port()}"],
                 env={"NOTIFY_SOCKET": notify.address})
    try:
        proc.stdin.write(b"one line, then silence\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        assert notify.wait_for(status_with("1 read, 1 sent"))
        # The last looks at the counters and the replay window's quiet checks: timers from
        # the status seen, which load does not stretch; the window is fixed, as a
        # publisher that never sleeps backs off and would leave some window quiet.
        time.sleep(5.0)
        assert main_thread_wakeups(proc) == 0
        # Asleep, the publisher wakes for the next line and says it.
        proc.stdin.write(b"a second line\n")
        proc.stdin.flush()
        assert notify.wait_for(status_with("2 read, 2 sent"))
        assert metric_value(read_metrics(metrics), "zmqpush_events_sent_total") == 2
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def test_idle_with_the_receiver_down_the_publisher_sleeps_until_one_connects(notify,
                                                                             tmp_path):
    """Lines wait, but with no receiver nothing can change them: no look at the
    counters until the connection event, which wakes the publisher."""
    port = free_port()
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-q", "-c", f"tcp://127.0.0.1:{port}", "--metrics-file", str(metrics)],
                 env={"NOTIFY_SOCKET": notify.address})
    receiver = None
    try:
        proc.stdin.write(b"one line, no receiver\n")
        proc.stdin.flush()
        assert notify.wait_for(status_with("1 read, 0 sent"))
        time.sleep(3.0)  # the one-time notice, the last look (as above: fixed)
        assert main_thread_wakeups(proc) == 0
        receiver = Receiver(port)
        assert receiver.wait_for(1, 10) == 1
        assert notify.wait_for(status_with("1 read, 1 sent", "1 receivers connected"))
        assert metric_value(read_metrics(metrics), "zmqpush_events_sent_total") == 1
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
        if receiver is not None:
            receiver.stop()


@pytest.mark.alone
def test_idle_with_the_watchdog_on_only_its_pings_wake_the_main_thread(receiver, notify,
                                                                       tmp_path):
    proc = start(["-q", "-c", receiver.endpoint, "--metrics-file", str(tmp_path / "z.prom")],
                 env={"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "400000"})
    try:
        proc.stdin.write(b"one line, then silence\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        # The replay window's quiet checks ended before this status; the publisher's
        # last look comes PUBLISH_SECONDS (2 s) after it, past the window measured.
        assert notify.wait_for(status_with("1 read, 1 sent"))
        pings = len(notify.pings())
        switches = main_thread_sleeps(proc.pid)
        time.sleep(1.4)
        switches = main_thread_sleeps(proc.pid) - switches
        pings = len(notify.pings()) - pings
        assert pings >= 5  # every 0.2 s: 7 (3 or 4 at twice the interval)
        assert switches <= pings + 1, (switches, pings)
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def main_thread_sleeps(pid: int) -> int:
    """The times a process's main thread went to sleep (voluntary context
    switches): one for each wake-up, which load does not add to as it does
    preemptions (nonvoluntary ones)."""
    with open(f"/proc/{pid}/task/{pid}/status") as f:
        return sum(int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt"))


def read_metrics(path, timeout: float = 10.0, predicate=None) -> dict:
    """{name: family} of the metrics file, parsed by prometheus_client, once it
    exists (and predicate accepts the families)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            text = path.read_text()
        except FileNotFoundError:
            text = None
        if text is not None:
            families = {f.name: f for f in text_string_to_metric_families(text)}
            if predicate is None or predicate(families) or time.monotonic() > deadline:
                return families
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.05)


def metric_value(families: dict, name: str) -> float:
    """The one sample of a metric (prometheus_client names a counter's family
    without _total)."""
    family = families[name[:-len("_total")] if name.endswith("_total") else name]
    (sample,) = [s for s in family.samples if s.name == name]
    return sample.value


def sent(count: int):
    return lambda families: metric_value(families, "zmqpush_events_sent_total") == count


def test_metrics_file_holds_the_counters_in_prometheus_format_and_is_removed_at_exit_0(
        receiver, tmp_path):
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-c", receiver.endpoint, "--metrics-file", str(metrics),
                  "--metrics-name", 'web "1"', "app"])
    try:
        proc.stdin.write(b"one\ntwo\nthree\nfour\nfive\n")
        proc.stdin.flush()
        assert receiver.wait_for(5, 10) == 5
        families = read_metrics(metrics, predicate=sent(5))
        now = time.time()
        assert metric_value(families, "zmqpush_events_sent_total") == 5
        assert metric_value(families, "zmqpush_events_read_total") == 5
        assert metric_value(families, "zmqpush_read_bytes_total") == 24
        assert metric_value(families, "zmqpush_receivers_connected") == 1
        assert families["zmqpush_events_sent"].type == "counter"
        assert families["zmqpush_receivers_connected"].type == "gauge"
        assert families["zmqpush_events_sent"].documentation.startswith("Events handed")
        for family in families.values():
            for sample in family.samples:
                assert sample.labels == {"logtype": "app", "name": 'web "1"'}, sample
        updated = metric_value(families, "zmqpush_last_update_timestamp_seconds")
        started = metric_value(families, "zmqpush_start_time_seconds")
        assert started <= updated <= now
        assert "zmqpush_spool_bytes" not in families
        assert "zmqpush_exit_code" not in families
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert os.listdir(tmp_path) == []  # the file removed, no temporary file left


def test_metrics_help_says_read_counts_events_after_joining(receiver, tmp_path):
    """Issue 36: 3 lines joined into one event and 2 lines of their own make 3
    events read (as the closing line counts them), and the HELP says so."""
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-c", receiver.endpoint, "--metrics-file", str(metrics),
                  "--multiline", "python", "--linger", "30"])
    try:
        proc.stdin.write(b"plain\nTraceback (most recent call last):\n"
                         b'  File "a.py", line 1, in <module>\nValueError: x\n10:00 after\n')
        proc.stdin.flush()  # a record line after the trace: its own event
        families = read_metrics(metrics, timeout=20, predicate=sent(3))
        assert metric_value(families, "zmqpush_events_read_total") == 3
        assert metric_value(families, "zmqpush_multiline_lines_total") == 3
        assert "after joining" in families["zmqpush_events_read"].documentation
        assert "not bytes nor lines read" in families["zmqpush_events_read"].documentation
        assert "Lines read" in families["zmqpush_multiline_lines"].documentation
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        stop_process(proc)


def test_metrics_file_with_a_spool_has_the_spool_figures(receiver, tmp_path):
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-c", receiver.endpoint, "--metrics-file", str(metrics),
                  "--spool", str(tmp_path / "spool")])
    try:
        proc.stdin.write(b"spooled\n")
        proc.stdin.flush()
        families = read_metrics(metrics, predicate=sent(1))
        assert {"zmqpush_spool_bytes", "zmqpush_spool_segments", "zmqpush_spool_unsent_bytes",
                "zmqpush_spool_oldest_unsent_age_seconds", "zmqpush_spool_damaged_stretches",
                "zmqpush_spool_found_events", "zmqpush_spool_memory_only_events"} < set(families)
        assert metric_value(families, "zmqpush_spool_unsent_bytes") == 0
        assert metric_value(families, "zmqpush_spool_found_events_total") == 0
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
    assert not metrics.exists()


def test_metrics_file_outlives_a_killed_run_with_its_last_update_time(receiver, tmp_path):
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-c", receiver.endpoint, "--metrics-file", str(metrics)])
    try:
        proc.stdin.write(b"one\ntwo\n")
        proc.stdin.flush()
        families = read_metrics(metrics, predicate=sent(2))
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
    finally:
        stop_process(proc)
    time.sleep(0.5)
    left = {f.name: f for f in text_string_to_metric_families(metrics.read_text())}
    assert metric_value(left, "zmqpush_events_sent_total") == 2
    updated = metric_value(left, "zmqpush_last_update_timestamp_seconds")
    assert updated == metric_value(families, "zmqpush_last_update_timestamp_seconds")
    assert updated < time.time() - 0.4


def test_metrics_file_of_a_run_that_left_lines_undelivered_keeps_its_exit_code(tmp_path):
    metrics = tmp_path / "zmqpush.prom"
    proc = start(["-q", "-c", f"tcp://127.0.0.1:{free_port()}", "--linger", "0.2",
                  "--metrics-file", str(metrics)])
    try:
        proc.stdin.write(b"nobody takes this\n")
        proc.stdin.close()
        assert proc.wait(10) == 3
    finally:
        stop_process(proc)
    families = read_metrics(metrics)
    assert metric_value(families, "zmqpush_exit_code") == 3
    assert metric_value(families, "zmqpush_events_read_total") == 1
    assert metric_value(families, "zmqpush_events_sent_total") == 0


def test_metrics_file_with_a_spool_left_undelivered_keeps_exit_3(tmp_path):
    """The spool is closed before the metrics file's last version is written: its
    figures must still be there (a closed spool once made the run fail, exit 1)."""
    metrics, receiver = tmp_path / "zmqpush.prom", Receiver(free_port())
    proc = start(["-q", "-c", receiver.endpoint, "--linger", "0.5", "--metrics-file",
                  str(metrics), "--spool", str(tmp_path / "spool")])
    try:
        proc.stdin.write(b"taken\n" * 100)
        proc.stdin.flush()
        assert receiver.wait_for(100, 10) == 100
        receiver.stop()
        time.sleep(0.5)
        proc.stdin.write(b"left\n" * 5)
        proc.stdin.close()
        assert proc.wait(20) == 3, proc.stderr.read()
    finally:
        stop_process(proc)
    assert metric_value(read_metrics(metrics), "zmqpush_exit_code") == 3


@pytest.mark.parametrize("kind", ["symlink", "fifo", "not-prom"])
def test_metrics_file_never_takes_over_what_is_not_its_own(tmp_path, kind):
    """zmqpush replaces and removes its file: a link, a pipe or a name the textfile
    collector would not read is refused at start, and left as it was."""
    target = tmp_path / "precious"
    target.write_text("keep me")
    path = tmp_path / ("m.txt" if kind == "not-prom" else "m.prom")
    if kind == "symlink":
        path.symlink_to(target)
    elif kind == "fifo":
        os.mkfifo(path)
    proc = subprocess.run([ZMQPUSH, "--metrics-file", str(path)], input=b"",
                          capture_output=True, timeout=20)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count(b"\n") == 1 and b"--metrics-file" in proc.stderr
    assert target.read_text() == "keep me"
    assert path.is_symlink() if kind == "symlink" else (
        path.is_fifo() if kind == "fifo" else not path.exists())


def test_metrics_file_with_the_longest_name_a_file_can_have(receiver, tmp_path):
    """The temporary file beside it must not be longer than the name itself."""
    metrics = tmp_path / ("m" * 250 + ".prom")
    proc = start(["-c", receiver.endpoint, "--metrics-file", str(metrics)])
    try:
        proc.stdin.write(b"one\n")
        proc.stdin.flush()
        assert metric_value(read_metrics(metrics, predicate=sent(1)),
                            "zmqpush_events_sent_total") == 1
        proc.stdin.close()
        assert proc.wait(10) == 0
        assert b"cannot write" not in proc.stderr.read()
    finally:
        stop_process(proc)


def test_pid_placeholder_gives_each_instance_its_own_file_and_label(receiver, tmp_path):
    args = ["-c", receiver.endpoint, "--metrics-file", str(tmp_path / "zmqpush-{pid}.prom")]
    procs = [start(args), start(args)]
    try:
        for n, proc in enumerate(procs):
            proc.stdin.write(b"line %d\n" % n)
            proc.stdin.flush()
        for proc in procs:
            families = read_metrics(tmp_path / f"zmqpush-{proc.pid}.prom", predicate=sent(1))
            sample = families["zmqpush_events_sent"].samples[0]
            assert sample.labels == {"logtype": "syslog", "pid": str(proc.pid)}
        for proc in procs:
            proc.stdin.close()
            assert proc.wait(10) == 0
    finally:
        for proc in procs:
            stop_process(proc)
    assert os.listdir(tmp_path) == []


def test_metrics_file_in_a_missing_directory_is_a_usage_error(tmp_path):
    proc = subprocess.run([ZMQPUSH, "--metrics-file", str(tmp_path / "no" / "z.prom")],
                          input=b"", capture_output=True, timeout=20)
    assert proc.returncode == 2
    assert b"--metrics-file" in proc.stderr and b"no directory" in proc.stderr




def ini_block(path: Path, after: str) -> str:
    """The first ```ini block of the file at path after the text `after`."""
    text = path.read_text()
    text = text[text.index(after):]
    return text[text.index("```ini\n") + 7:].split("```", 1)[0]


# The unit files as the READMEs give them: the README's journal unit, and the shell
# pipeline beside it in bench/README.md.
UNIT_JOURNAL = ini_block(ROOT / "README.md", "## Running as a service")
UNIT_PIPELINE = ini_block(ROOT / "bench" / "README.md", "### Running as a service, in full")

# journalctl as the units run it, reading a real journal file (no systemd as PID 1
# here): a script named journalctl (so pkill -x finds it) first on PATH writes its
# pid into the state directory and execs the machine's journalctl with --file.
JOURNALCTL = shutil.which("journalctl") or "/usr/bin/journalctl"
JOURNALCTL_ON_FILE = """#!/bin/sh
echo $$ > "$UNIT_STATE/journalctl.pid"
exec {journalctl} --file="$UNIT_JOURNAL_FILE" "$@"
"""
UNIT_JOURNAL_ENTRIES = 8  # journalctl -f with no cursor starts at the last 10


def unit_journal_file(path: Path) -> str:
    """A real journal file of UNIT_JOURNAL_ENTRIES entries "entry N" of one program."""
    data = b"".join(export_entry([
        (b"__REALTIME_TIMESTAMP", b"%d" % (FIRST_MICROS + n * 1000)),
        (b"__MONOTONIC_TIMESTAMP", b"%d" % (1000 + n)), (b"_BOOT_ID", BOOT_ID.encode()),
        (b"MESSAGE", b"entry %d" % n), (b"PRIORITY", b"5"),
        (b"SYSLOG_IDENTIFIER", b"app"), (b"_PID", b"42")])
        for n in range(UNIT_JOURNAL_ENTRIES))
    subprocess.run([JOURNAL_REMOTE, "-o", str(path), "-"], input=data, check=True,
                   capture_output=True, timeout=30)
    return str(path)


def journalctl_writes_cursor_when_stopped() -> bool:
    """journalctl -f writes its --cursor-file at SIGTERM only from systemd 254 on
    (systemd#26746, fixed by #27519); Debian 12 has 252."""
    version = subprocess.run([JOURNALCTL, "--version"], capture_output=True, text=True,
                             check=True).stdout.split()[1]
    return int(version.split(".")[0].split("~")[0]) >= 254


def unit_command(unit: str, key: str, places: dict) -> list:
    """The argv of a unit's ExecStart= or ExecStop= as systemd runs it ($$ is $),
    with the unit's paths and endpoint replaced by the test's."""
    (line,) = [line for line in unit.splitlines() if line.startswith(key + "=")]
    text = line.split("=", 1)[1].replace("$$", "$")
    for old, new in places.items():
        text = text.replace(old, new)
    return shlex.split(text)


@pytest.fixture
def unit_places(tmp_path, receiver):
    """The test's stand-ins for the units' paths, journalctl on a real journal file
    first on PATH (the environment its wrapper needs under UNIT_*)."""
    bin_dir, state, textfile = tmp_path / "bin", tmp_path / "state", tmp_path / "textfile"
    for directory in (bin_dir, state, textfile):
        directory.mkdir()
    wrapper = bin_dir / "journalctl"
    wrapper.write_text(JOURNALCTL_ON_FILE.format(journalctl=JOURNALCTL))
    wrapper.chmod(0o755)
    return {"/usr/local/bin/zmqpush.py": ZMQPUSH,
            "tcp://logstash.example:2120": receiver.endpoint,
            "/var/lib/zmqpush": str(state),
            "/var/lib/prometheus/node-exporter": str(textfile),
            "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "UNIT_STATE": str(state),
            "UNIT_JOURNAL_FILE": unit_journal_file(tmp_path / "system.journal")}


def unit_environment(places: dict) -> dict:
    """What the units' journalctl wrapper needs, and PATH that finds it."""
    return {key: places[key] for key in ("PATH", "UNIT_STATE", "UNIT_JOURNAL_FILE")}


def start_as_systemd(argv: list, environment: dict) -> subprocess.Popen:
    """argv started as systemd starts a service's main process: SYSTEMD_EXEC_PID
    and WATCHDOG_PID are the pid of the process that execs argv."""
    return subprocess.Popen(
        ["/bin/sh", "-c", 'SYSTEMD_EXEC_PID=$$ WATCHDOG_PID=$$ exec "$@"', "sh", *argv],
        env={**os.environ, **environment}, stderr=subprocess.PIPE, start_new_session=True)


def stop_unit(main: subprocess.Popen):
    """End what start_as_systemd started, its pipeline's processes too (they are
    the process group it made, as systemd's cgroup holds a unit's)."""
    try:
        os.killpg(main.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    main.wait(10)


@pytest.mark.parametrize("unit", [UNIT_JOURNAL, UNIT_PIPELINE], ids=["journal", "pipeline"])
def test_unit_files_pass_systemd_analyze_verify(unit, tmp_path):
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    path = tmp_path / "zmqpush-journal.service"
    path.write_text(unit)
    check = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True,
                           timeout=60)
    assert check.returncode == 0, check.stderr
    assert str(path) not in check.stderr.decode(), check.stderr  # no line about it


def test_journal_unit_runs_zmqpush_as_its_main_process_and_stops_without_loss(
        receiver, notify, unit_places, tmp_path):
    """The unit's journalctl on a real journal file: zmqpush ships structured events
    (--journal) as the main process (NotifyAccess=main is enough, WATCHDOG_PID is its
    own); ExecStop ends journalctl first (which writes its cursor from systemd 254 on),
    and zmqpush delivers all it read, removes its metrics file and exits 0."""
    count = UNIT_JOURNAL_ENTRIES
    environment = {"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "400000",
                   **unit_environment(unit_places)}
    main = start_as_systemd(unit_command(UNIT_JOURNAL, "ExecStart", unit_places),
                            environment)
    stop = None
    try:
        ready = notify.wait_for(lambda text: text.startswith("READY=1\n"))
        assert ready, notify.texts()
        assert (ready, main.pid) in notify.senders
        assert receiver.wait_for(count, 10) == count
        assert notify.wait_for(lambda text: text == "WATCHDOG=1", 2)
        assert all(pid == main.pid for _, pid in notify.senders)
        metrics = tmp_path / "textfile" / "zmqpush-journal.prom"
        assert metric_value(read_metrics(metrics, predicate=sent(count)),
                            "zmqpush_events_sent_total") == count
        stop = subprocess.Popen(unit_command(UNIT_JOURNAL, "ExecStop", unit_places),
                                env={**os.environ, "MAINPID": str(main.pid)})
        assert main.wait(20) == 0, main.stderr.read()
        assert stop.wait(10) == 0
    finally:
        stop_unit(main)
        if stop is not None:
            stop_process(stop)
    events = receiver.events()
    assert [e["message"] for e in events] == [f"entry {n}" for n in range(count)]
    assert {(e["type"], e["program"], e["pid"], e["severity"]) for e in events} == {
        ("journal", "app", 42, 5)}
    last_cursor = events[-1]["@metadata"]["_id"]
    cursor = tmp_path / "state" / "journal.cursor"
    if journalctl_writes_cursor_when_stopped():
        assert cursor.read_text() == last_cursor
    else:  # as README "Structured logs" says of systemd 252
        assert not cursor.exists()
    assert not metrics.exists()
    assert notify.wait_for(lambda text: text.startswith("STOPPING=1\n"), 2)


@pytest.mark.parametrize("unset", [True, False], ids=["as-written", "without-unset"])
def test_pipeline_unit_needs_notify_access_all_and_its_pids_unset(
        receiver, notify, unit_places, tmp_path, unset):
    """In `sh -c 'journalctl | zmqpush.py'` the main process is the shell: the
    messages come from another pid (NotifyAccess=all), and SYSTEMD_EXEC_PID and
    WATCHDOG_PID, which systemd sets, name the shell: zmqpush notifies and pings
    only once the unit unsets them."""
    unit = UNIT_PIPELINE if unset else UNIT_PIPELINE.replace(
        "unset SYSTEMD_EXEC_PID WATCHDOG_PID; ", "")
    main = start_as_systemd(unit_command(unit, "ExecStart", unit_places),
                            {"NOTIFY_SOCKET": notify.address, "WATCHDOG_USEC": "400000",
                             **unit_environment(unit_places)})
    try:
        assert receiver.wait_for(UNIT_JOURNAL_ENTRIES, 10) == UNIT_JOURNAL_ENTRIES
        assert receiver.messages()[0] == "entry 0"
        time.sleep(1.0)
        senders = {pid for _, pid in notify.senders}
        if unset:
            assert any(text.startswith("READY=1\n") for text in notify.texts())
            assert notify.pings()
            assert len(senders) == 1 and main.pid not in senders
            # systemd takes messages from a pid other than the main one only so
            assert "NotifyAccess=all" in unit.splitlines()
        else:
            assert notify.messages == []
        journalctl = int((tmp_path / "state" / "journalctl.pid").read_text())
        os.kill(journalctl, signal.SIGTERM)
        assert main.wait(20) == 0, main.stderr.read()
    finally:
        stop_unit(main)


def test_under_rsyslog_started_by_systemd_zmqpush_leaves_rsyslogs_notify_socket_alone(
        receiver, notify, tmp_path):
    """rsyslog.service is Type=notify, and rsyslogd passes NOTIFY_SOCKET on to its
    omprog programs; SYSTEMD_EXEC_PID (rsyslogd's pid: systemd started it) tells
    zmqpush that the unit's messages are not its own. The metrics file still works."""
    assert available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"
    metrics = tmp_path / "zmqpush-{pid}.prom"
    # systemd sets SYSTEMD_EXEC_PID to rsyslogd's pid; any pid not zmqpush's is alike
    environment = {**os.environ, "NOTIFY_SOCKET": notify.address,
                   "SYSTEMD_EXEC_PID": str(os.getpid())}
    rs = PrivateRsyslog(tmp_path / "rsyslog", omprog(
        binary("app", "-c", receiver.endpoint, "--metrics-file", str(metrics)), tmp_path),
        env=environment)
    rs.start()
    try:
        rs.send(["through rsyslog"])
        assert receiver.wait_for(1, 10) == 1
        (child,) = wait_children(rs)
        families = read_metrics(tmp_path / f"zmqpush-{child}.prom", predicate=sent(1))
        assert metric_value(families, "zmqpush_events_read_total") == 1
        time.sleep(1.0)
        assert notify.senders == [("READY=1", rs.proc.pid)]  # rsyslogd's, and no other
    finally:
        rs.stop()


def http_get(port: int, path: str, method: str = "GET", timeout: float = 10.0) -> tuple:
    """(status, body) of one request to 127.0.0.1:port, retried until it listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request(method, path)
            response = connection.getresponse()
            answer = response.status, response.read().decode()
            connection.close()
            return answer
        except ConnectionRefusedError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


def test_metrics_listen_serves_the_metrics_and_a_health_check(receiver):
    port = free_port()
    proc = start(["-c", receiver.endpoint, "--metrics-listen", f"127.0.0.1:{port}",
                  "--metrics-name", "web1", "app"])
    try:
        proc.stdin.write(b"one\ntwo\n")
        proc.stdin.flush()
        assert receiver.wait_for(2, 10) == 2
        status, body = http_get(port, "/metrics")
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body)}
        assert metric_value(families, "zmqpush_events_sent_total") == 2
        assert families["zmqpush_events_sent"].samples[0].labels == {"logtype": "app",
                                                                    "name": "web1"}
        assert http_get(port, "/healthz") == (200, "ok\n")
        assert http_get(port, "/elsewhere")[0] == 404
        assert http_get(port, "/metrics", method="POST")[0] == 405
        assert http_get(port, "/healthz?stall=soon")[0] == 400
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)


def healthz_until_stalled(port: int, stall: float, timeout: float) -> tuple:
    """(when it was asked, (status, body)) of the first /healthz?stall= request that is
    not answered "ok", asked every 0.2 s for at most timeout: a wait counts from the first
    look or request that sees it (under load, a look may come before the line was read)."""
    deadline = time.monotonic() + timeout
    while True:
        asked = time.monotonic()
        answer = http_get(port, f"/healthz?stall={stall:g}")
        if answer != (200, "ok\n") or asked > deadline:
            return asked, answer
        time.sleep(0.2)


def test_healthz_fails_once_lines_waited_longer_than_stated_with_none_sent():
    port, listen = free_port(), free_port()
    proc = start(["-q", "-c", f"tcp://127.0.0.1:{port}", "--metrics-listen",
                  f"127.0.0.1:{listen}"])
    receiver = None
    try:
        assert http_get(listen, "/healthz?stall=1") == (200, "ok\n")
        proc.stdin.write(b"waits for a receiver\n")
        proc.stdin.flush()
        written = time.monotonic()
        asked, (status, body) = healthz_until_stalled(listen, 1, 15)
        assert asked - written > 1.0  # no sooner than the line waited a second
        assert status == 503 and body.startswith("stalled: events wait, none sent for ")
        assert http_get(listen, "/healthz") == (200, "ok\n")  # 60 s by default
        receiver = Receiver(port)
        assert receiver.wait_for(1, 10) == 1
        assert http_get(listen, "/healthz?stall=1") == (200, "ok\n")
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
        if receiver is not None:
            receiver.stop()


def test_metrics_listen_on_an_address_in_use_is_a_runtime_error(receiver):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([ZMQPUSH, "-c", receiver.endpoint, "--metrics-listen",
                               f"127.0.0.1:{port}"], input=b"x\n", capture_output=True,
                              timeout=20)
    assert proc.returncode == 1
    assert f"zmqpush: cannot listen on --metrics-listen 127.0.0.1:{port}: ".encode() \
        in proc.stderr
