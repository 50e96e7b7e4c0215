"""Issue 6: fields, counters, live view, connection events, configuration by environment."""
import json
import os
import pty
import select
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone

import pytest

from conftest import (
    SINK,
    Receiver,
    closing_count,
    free_port,
    run,
    start,
    stop_process,
    unstamped,
    wait_stop_signals_taken,
)


def test_host_timestamp_and_static_fields_are_added_and_escaped(receiver):
    before = datetime.now(timezone.utc)
    proc = run(["-c", receiver.endpoint, "--host-field", "--timestamp",
                "-f", 'env=prod "eu"', "-f", "tab\tkey=v\\x", "app"], b"one\ntwo\n")
    after = datetime.now(timezone.utc)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(2) == 2
    first = receiver.frames[0].decode()
    assert first.startswith('{"message":"one","type":"app","@pid":')
    event = json.loads(first, strict=True)
    assert list(event) == ["message", "type", "@pid", "host", "env", "tab\tkey",
                           "@timestamp"]
    assert event["host"] == socket.gethostname()
    assert event["env"] == 'env=prod "eu"'.split("=", 1)[1]
    assert event["tab\tkey"] == "v\\x"
    stamp = event["@timestamp"]
    assert len(stamp) == 24 and stamp.endswith("Z")
    when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert before.replace(microsecond=before.microsecond // 1000 * 1000) <= when <= after


def test_fields_work_in_batch_mode_too(receiver):
    proc = run(["-c", receiver.endpoint, "--batch", "-f", "dc=x"], b"a\nb\n")
    assert proc.returncode == 0, proc.stderr
    receiver.wait_for(1)
    assert [e["dc"] for e in receiver.events()] == ["x", "x"]


def test_timestamp_is_when_the_line_was_read_not_when_sent():
    port = free_port()
    proc = start(["-c", f"tcp://127.0.0.1:{port}", "--timestamp"])
    try:
        wait_stop_signals_taken(proc)  # running: it reads the line soon (not after start-up)
        written_at = datetime.now(timezone.utc)
        proc.stdin.write(b"early\n")
        proc.stdin.flush()
        time.sleep(1.5)  # receiver down: the line waits in zmqpush/ZeroMQ
        receiver_from = datetime.now(timezone.utc)
        receiver = Receiver(port)
        proc.stdin.close()
        assert proc.wait(10) == 0
        assert receiver.wait_for(1) == 1
        stamp = receiver.events()[0]["@timestamp"]
        when = datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
        # read after it was written (the stamp has milliseconds), sent once a receiver was
        # there: a stamp from before the receiver is the read's, however late load made it
        assert written_at - timedelta(milliseconds=1) <= when < receiver_from
        receiver.stop()
    finally:
        stop_process(proc)


def test_bad_field_specs_are_refused():
    for args, word in ((["-f", "novalue"], "KEY=VALUE"), (["-f", "=v"], "KEY=VALUE"),
                       (["-f", "message=x"], "reserved"), (["-f", "@pid=1"], "reserved"),
                       (["-f", "type=x"], "reserved"), (["-f", "@timestamp=x"], "reserved"),
                       (["-f", "a=1", "-f", "a=2"], "twice"),
                       (["--host-field", "-f", "host=h"], "reserved")):
        proc = run(args, b"x\n", timeout=10)
        assert proc.returncode == 2, args
        assert word in proc.stderr.decode() and len(proc.stderr.splitlines()) == 1


def test_keys_logstash_gives_a_meaning_are_refused_in_one_line():
    """@metadata or event (ECS v8) as a string would make every frame one
    _jsonparsefailure event; tags, @version and host have Logstash meanings;
    no Logstash field reference can name a key holding [ or ]."""
    for key in ("@metadata", "event", "tags", "@version", "host"):
        proc = run(["-f", f"{key}=x"], b"x\n", timeout=10)
        assert proc.returncode == 2, key
        assert unstamped(proc.stderr.decode()).startswith(f"zmqpush: field '{key}' is reserved")
        assert len(proc.stderr.splitlines()) == 1
    for key in ("a[b]", "[a]", "a]", "["):
        proc = run(["-f", f"{key}=x"], b"x\n", timeout=10)
        assert proc.returncode == 2, key
        assert b"[ or ]" in proc.stderr and len(proc.stderr.splitlines()) == 1
    env = run([], b"x\n", timeout=10, env={"ZMQPUSH_FIELD": "ok=1,tags=x"})
    assert env.returncode == 2 and b"'tags' is reserved" in env.stderr


def test_keys_near_reserved_ones_are_accepted(receiver):
    proc = run(["-c", receiver.endpoint, "-f", "hostname=h", "-f", "event.kind=k",
                "-f", "@tag=t", "-f", "a.b=c"], b"x\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    event = json.loads(receiver.frames[0])
    assert [event[k] for k in ("hostname", "event.kind", "@tag", "a.b")] == ["h", "k", "t", "c"]


def ecs_host_events(receiver, args, data: bytes, expect: int) -> tuple:
    """Run zmqpush with --host-field-ecs and args; (its stdout, the events), the
    events checked byte for byte."""
    proc = run(["-c", receiver.endpoint, "--host-field-ecs", "-f", "dc=eu", *args, "app"],
               data)
    assert proc.returncode == 0, proc.stderr
    receiver.wait_for(1)
    assert receiver.settle(0.3) >= 1
    events = receiver.events()
    assert len(events) == expect
    pid = events[0]["@pid"]
    host = json.dumps(socket.gethostname(), ensure_ascii=False)
    tail = f'"type":"app","@pid":{pid},"host":{{"name":{host}}},"dc":"eu"}}'.encode()
    for frame in receiver.frames:
        assert frame.endswith(tail + (b"]" if frame.startswith(b"[") else b""))
    return proc.stdout, events


def test_host_field_ecs_sends_a_host_object_in_default_mode(receiver):
    _, events = ecs_host_events(receiver, [], b"one\ntwo\n", 2)
    assert [e["message"] for e in events] == ["one", "two"]
    assert len(receiver.frames) == 2 and receiver.frames[0].startswith(b'{"message":"one"')


def test_host_field_ecs_in_batch_mode(receiver):
    _, events = ecs_host_events(receiver, ["--batch"], b"one\ntwo\n", 2)
    assert receiver.frames[0].startswith(b'[{"message":"one"')
    assert all(e["host"] == {"name": socket.gethostname()} for e in events)


def test_host_field_ecs_in_confirm_mode(receiver):
    stdout, events = ecs_host_events(receiver, ["--confirm"], b"one\ntwo\n", 2)
    assert [e["message"] for e in events] == ["one", "two"]
    assert stdout == b"OK\nOK\nOK\n"


def test_host_options_take_no_value_so_logtype_stays_positional(receiver):
    """--host-field app and --host-field-ecs app mean LOGTYPE=app."""
    for option, host in (("--host-field", socket.gethostname()),
                         ("--host-field-ecs", {"name": socket.gethostname()})):
        receiver.frames.clear()
        proc = run(["-c", receiver.endpoint, option, "app"], b"x\n")
        assert proc.returncode == 0, proc.stderr
        assert receiver.wait_for(1) == 1
        (event,) = receiver.events()
        assert (event["type"], event["host"]) == ("app", host)


def test_host_field_ecs_from_the_environment_and_not_with_host_field(receiver):
    proc = run(["-c", receiver.endpoint], b"x\n", env={"ZMQPUSH_HOST_FIELD_ECS": "1"})
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    assert receiver.events()[0]["host"] == {"name": socket.gethostname()}
    both = run(["--host-field", "--host-field-ecs"], b"x\n", timeout=10)
    assert both.returncode == 2 and len(both.stderr.splitlines()) == 1
    assert b"cannot be combined" in both.stderr


def test_stats_lines_parse_and_match_what_the_receiver_got(receiver):
    proc = start(["-c", receiver.endpoint, "--stats", "0.2", "--stats-format", "json"])
    try:
        proc.stdin.write(b"".join(b"%d\n" % i for i in range(1000)))
        proc.stdin.flush()
        assert receiver.wait_for(1000) == 1000
        time.sleep(0.5)
        proc.stdin.close()
        assert proc.wait(10) == 0
        lines = proc.stderr.read().decode().splitlines()
        stats = [json.loads(line) for line in lines if line.startswith("{")]
        assert len(stats) >= 2
        last = stats[-1]
        assert last["sent"] == last["read"] == 1000 == len(receiver.frames)
        assert last["queued"] == 0 and last["dropped"] == 0 and last["connected"] == 1
        assert set(last) == {"read", "bytes", "sent", "queued", "dropped", "split",
                             "transport_bytes", "drain_waits", "connected", "disconnects",
                             "replayed", "window_bytes", "handshake_failures", "refused",
                             "rate"}
        assert last["handshake_failures"] == last["refused"] == 0
    finally:
        stop_process(proc)


def stats_fields(line: str) -> dict:
    """The counters of one text stats line "zmqpush: read=N sent=N ..."."""
    return dict(kv.split("=") for kv in line.split(": ", 1)[1].split())


def text_stats(stderr: bytes) -> list:
    """The counters of every text stats line on stderr, in order."""
    return [stats_fields(line) for line in unstamped(stderr).decode().splitlines()
            if line.startswith("zmqpush: read=")]


def test_text_stats_print_on_the_stats_timer(receiver):
    proc = start(["-c", receiver.endpoint, "--stats", "0.2"])
    try:
        proc.stdin.write(b"x\ny\n")
        proc.stdin.flush()
        assert receiver.wait_for(2) == 2
        time.sleep(0.7)  # three or more turns of the 0.2 s timer, no signal
        proc.stdin.close()
        assert proc.wait(10) == 0
        stats = text_stats(proc.stderr.read())
        assert len(stats) >= 2, stats
        assert stats[-1]["read"] == stats[-1]["sent"] == "2" and stats[-1]["connected"] == "1"
    finally:
        stop_process(proc)


def test_sigusr1_prints_the_counters_of_that_moment_once_per_signal(receiver):
    """No --stats timer: each counters line is a SIGUSR1's, with the counts then."""
    proc = start(["-c", receiver.endpoint])
    try:
        for line, count in ((b"x\n", 1), (b"y\n", 2)):
            proc.stdin.write(line)
            proc.stdin.flush()
            assert receiver.wait_for(count) == count
            os.kill(proc.pid, signal.SIGUSR1)
            time.sleep(0.3)
        proc.stdin.close()
        assert proc.wait(10) == 0
        stats = text_stats(proc.stderr.read())
        assert [(s["read"], s["sent"], s["connected"]) for s in stats] == [
            ("1", "1", "1"), ("2", "2", "1")], stats
    finally:
        stop_process(proc)


def read_pty(fd: int, seconds: float) -> bytes:
    out, deadline = b"", time.monotonic() + seconds
    while time.monotonic() < deadline:
        if select.select([fd], [], [], 0.1)[0]:
            try:
                out += os.read(fd, 65536)
            except OSError:
                break
    return out


def test_progress_shows_on_a_terminal_only(receiver):
    master, slave = pty.openpty()
    proc = start(["-c", receiver.endpoint, "--progress"], stderr=slave)
    os.close(slave)
    try:
        proc.stdin.write(b"a\nb\nc\n")
        proc.stdin.flush()
        shown = read_pty(master, 1.5)
        proc.stdin.close()
        assert proc.wait(10) == 0
        shown += read_pty(master, 0.5)
        assert b"\r\x1b[Kzmqpush: " in shown
        assert b"3 sent" in shown and b"1 connected" in shown
    finally:
        stop_process(proc)
        os.close(master)
    plain = run(["-c", receiver.endpoint, "--progress"], b"d\n")
    assert plain.returncode == 0, plain.stderr
    assert b"\r" not in plain.stderr and b"lines/s" not in plain.stderr
    assert closing_count(plain.stderr) == 1


def connection_events_of_a_run(port: int, *args: str) -> str:
    """stderr of zmqpush connecting to port with args while a receiver starts
    there, gets a line and stops again; the run itself must exit 0."""
    proc = start(["-c", f"tcp://127.0.0.1:{port}", *args])
    try:
        time.sleep(0.5)
        receiver = Receiver(port)
        proc.stdin.write(b"x\n")
        proc.stdin.flush()
        assert receiver.wait_for(1) == 1
        time.sleep(2)  # the replay window empties: nothing to send again
        receiver.stop()
        time.sleep(0.5)
        proc.stdin.close()
        assert proc.wait(10) == 0, proc.stderr.read()
        err = proc.stderr.read().decode()
    finally:
        stop_process(proc)
    assert closing_count(err.encode()) == 1
    return err


def test_connection_events_when_a_receiver_starts_and_stops_and_quiet_silences_them():
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    err = connection_events_of_a_run(port)
    assert f"zmqpush: receiver connected {endpoint}" in err
    assert f"zmqpush: receiver disconnected {endpoint}" in err
    quiet = connection_events_of_a_run(port, "-q")
    (closing,) = quiet.splitlines()  # no event: only the closing line
    assert closing.startswith("Processed 1 messages"), quiet


def test_every_option_from_the_environment_with_no_arguments(receiver):
    env = {"ZMQPUSH_CONNECT": receiver.endpoint, "ZMQPUSH_LOGTYPE": "envtype",
           "ZMQPUSH_FIELD": "a=1,b=2", "ZMQPUSH_TIMESTAMP": "1", "ZMQPUSH_BATCH": "yes",
           "ZMQPUSH_QUIET": "on", "ZMQPUSH_LINGER": "2"}
    proc = run([], b"from env\n", env=env)
    assert proc.returncode == 0, proc.stderr
    receiver.wait_for(1)
    (frame,) = receiver.frames
    assert frame.startswith(b"[")
    (event,) = json.loads(frame)
    assert event["type"] == "envtype" and event["a"] == "1" and event["b"] == "2"
    assert "@timestamp" in event
    assert b"receiver" not in proc.stderr  # ZMQPUSH_QUIET: no connection event
    # Input ends once the line arrived: a run whose input ended before its connection
    # was made stops watching connections first, and says none (one run of many so).
    loud = start([], env={**env, "ZMQPUSH_QUIET": "off"})
    try:
        loud.stdin.write(b"from env\n")
        loud.stdin.flush()
        assert receiver.wait_for(2) == 2
        loud.stdin.close()
        assert loud.wait(30) == 0
        assert b"receiver connected" in loud.stderr.read()
    finally:
        stop_process(loud)
    down = f"tcp://127.0.0.1:{free_port()}"
    lingered = run([], b"x\n", env={**env, "ZMQPUSH_CONNECT": down, "ZMQPUSH_LINGER": "0.3"})
    assert lingered.returncode == 3
    assert b"1 messages were not handed to ZeroMQ within --linger 0.3s" in lingered.stderr
    bad = run([], b"", env={"ZMQPUSH_WHEN_FULL": "sometimes"})
    assert bad.returncode == 2 and b"ZMQPUSH_WHEN_FULL" in bad.stderr


def test_the_command_line_wins_over_the_environment(receiver):
    down = f"tcp://127.0.0.1:{free_port()}"
    env = {"ZMQPUSH_CONNECT": down, "ZMQPUSH_LOGTYPE": "envtype", "ZMQPUSH_FIELD": "a=env",
           "ZMQPUSH_LINGER": "30"}
    proc = run(["-c", receiver.endpoint, "-f", "a=cli", "argtype"],
               b"x\n", env=env, timeout=20)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    (event,) = receiver.events()
    assert (event["type"], event["a"]) == ("argtype", "cli")
    lingered = run(["--linger", "0.3"], b"x\n", env=env, timeout=20)
    assert lingered.returncode == 3
    assert b"within --linger 0.3s" in lingered.stderr


def test_help_all_groups_the_options_by_concern():
    text = run(["--help-all"], b"").stdout.decode()
    groups = {"connection:": ["--connect", "--bind", "--heartbeat"],
              "delivery and flow control:": ["--linger", "--replay-bytes", "--queue-bytes",
                                             "--when-full", "--sndhwm"],
              "input handling:": ["--max-line-bytes", "--batch", "--batch-bytes"],
              "fields:": ["--host-field", "--host-field-ecs", "--timestamp", "--field",
                          "--event-id"],
              "reporting:": ["--stats", "--stats-format", "--progress", "--quiet"],
              "rsyslog omprog:": ["--confirm", "--confirm-timeout"],
              "security:": ["--curve-server-cert", "--curve-cert", "--curve-clients", "--allow",
                            "--make-cert"]}
    starts = {heading: text.index("\n" + heading + "\n") for heading in groups}
    ends = [*sorted(starts.values()), text.index("\nexamples:")]
    for heading, options in groups.items():
        section = text[starts[heading]:ends[ends.index(starts[heading]) + 1]]
        for option in options:
            assert f"  {option} " in section or f", {option} " in section, (heading, option)


def test_sink_raw_prints_every_frame_as_it_came():
    """bench/sink.py --raw shows exactly what was sent: whole events with zmqpush's
    keys, a --batch array as one line; its summary still counts events."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sink = subprocess.Popen([sys.executable, SINK, "--bind", endpoint, "--raw",
                             "--count", "3", "--idle", "10"], stdout=subprocess.PIPE)
    try:
        result = run(["--batch", "-c", endpoint, "--field", "env=prod", "app"],
                     b"one\ntwo\tx\nthree\n")
        # The sink leaves once it has the 3: a zmqpush that hears it go before its own
        # end replays to no one and exits 3 (at load 15, 2 runs of 3; test_replay_at_end)
        assert result.returncode in (0, 3), result.stderr
        out, _ = sink.communicate(timeout=20)
    finally:
        stop_process(sink)
    *frames, summary = out.decode().splitlines()
    (array,) = [json.loads(frame) for frame in frames]
    assert [(e["message"], e["type"], e["env"]) for e in array] == [
        ("one", "app", "prod"), ("two\tx", "app", "prod"), ("three", "app", "prod")]
    assert summary.startswith("received 3 events (0 invalid)")


def wait_until_listening(port: int, most: float = 10.0):
    """Return once something accepts TCP connections on 127.0.0.1:port (bounded)."""
    deadline = time.monotonic() + most
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline, f"nothing listens on {port}"
            time.sleep(0.05)


@pytest.mark.parametrize("signum, extra", [(signal.SIGTERM, ["--idle", "60"]),
                                           (signal.SIGINT, [])])
def test_sink_stops_promptly_on_a_signal_with_no_traffic(signum, extra):
    """bench/sink.py idle (never sent anything) ends within seconds of SIGTERM or
    SIGINT with its summary, even with an --idle longer than that."""
    port = free_port()
    sink = subprocess.Popen([sys.executable, SINK, "--bind", f"tcp://127.0.0.1:{port}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_until_listening(port)
        os.kill(sink.pid, signum)
        out, err = sink.communicate(timeout=5)
    finally:
        stop_process(sink)
    assert sink.returncode == 0, err
    assert out.decode().startswith("received 0 events (0 invalid)"), out


def test_sink_help_states_its_default_endpoint():
    proc = subprocess.run([sys.executable, SINK, "--help"], capture_output=True, timeout=30)
    assert proc.returncode == 0 and "tcp://127.0.0.1:2120" in proc.stdout.decode()
