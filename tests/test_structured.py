"""Issue 26: structured logs (--json, --journal, rsyslog's JSON template), end to
end: the installed CLI, real PULL sockets on 127.0.0.1, each field checked on the
events received."""
import json
import os
import signal
import socket
import subprocess
import threading
import time

import pytest
from rsyslog import PrivateRsyslog, available

import zmqpush
from conftest import (
    ZMQPUSH,
    Receiver,
    closing_count,
    free_port,
    run,
    start,
    stop_process,
    unstamped,
)

DEEPEST = 100  # README "Structured logs": the deepest nesting merged
BRACKET = "a key holds [ or ] (Logstash reads it as a field reference)"

# (line, what arrives): a dict is the object's fields merged at the root; a str is
# the "@json_error" of a line sent as text.
HOSTILE = [
    (b'{"level":"info","msg":"ok","n":1,"nested":{"a":[1,2,{"b":null}]}}',
     {"level": "info", "msg": "ok", "n": 1, "nested": {"a": [1, 2, {"b": None}]}}),
    (b' \t{"spaced":true}  ', {"spaced": True}),
    (b'{}', {}),
    (b'{"caf\xc3\xa9":"\xe6\x97\xa5\\u00e9\\"q\\" \\\\ \\t"}', {"café": '日é"q" \\ \t'}),
    (b'{"pair":"\\ud83d\\ude00"}', {"pair": "😀"}),
    (b'{"dup":1,"dup":2}', {"dup": 2}),  # the last one, as Logstash's parser keeps it
    (b'{"big":123456789012345678901234567890,"f":1.5e300,"neg":-0.0}',
     {"big": 123456789012345678901234567890, "f": 1.5e300, "neg": -0.0}),
    (b'{"d":' + b"[" * (DEEPEST - 1) + b"]" * (DEEPEST - 1) + b"}",
     {"d": json.loads(b"[" * (DEEPEST - 1) + b"]" * (DEEPEST - 1))}),
    (b'{"d":' + b"[" * DEEPEST + b"]" * DEEPEST + b"}", f"nested deeper than {DEEPEST}"),
    (b"[" * 5000 + b"]" * 5000, f"nested deeper than {DEEPEST}"),
    (b"{" + b'"a":{' * 3000 + b"}" * 3001, f"nested deeper than {DEEPEST}"),
    (b'[{"a":1}]', "not a JSON object"),
    (b"42", "not a JSON object"),
    (b'"a string"', "not a JSON object"),
    (b"null", "not a JSON object"),
    (b"true", "not a JSON object"),
    (b'{"n":NaN}', "NaN or Infinity"),
    (b'{"n":Infinity}', "NaN or Infinity"),
    (b'{"n":-Infinity}', "NaN or Infinity"),
    (b"NaN", "NaN or Infinity"),
    (b'{"bad":"\xff\xfe"}', "invalid UTF-8"),
    (b'{"lone":"\\ud800"}', "lone surrogate"),
    (b'{"lone":"x\\udfff"}', "lone surrogate"),
    (b'{"tab":"raw\ttab"}', "not JSON"),  # a raw control character in a string
    (b'{"a":1} trailing', "not JSON"),
    (b'{"a":1}{"b":2}', "not JSON"),
    (b'{"a":1,}', "not JSON"),
    (b"{'single':1}", "not JSON"),
    (b"plain text line", "not JSON"),
    (b"", "not JSON"),
    (b"\xef\xbb\xbf{\"bom\":1}", "not JSON"),
    (b'{"a[b]":1}', BRACKET),  # Logstash would tag it _jsonparsefailure: said here
    (b'{"x":{"[":2}}', BRACKET),
    (b'{"l":[{"in]ner":1}]}', BRACKET),
    (b'{"a\\u005bb":1}', BRACKET),
    (b'{"a":"b",":[":1}', BRACKET),
    (b'{"t":["a","b"],"k":"[x]: y","q":"\\"[\\"","":[]}',
     {"t": ["a", "b"], "k": "[x]: y", "q": '"["', "": []}),
]


def events_of(receiver, count: int) -> list:
    assert receiver.wait_for(count, 30) >= count
    receiver.settle(0.3)
    return receiver.events()


def plain_event(line: bytes, endpoint_receiver_args=()) -> dict:
    """What the plain mode sends for line (without "@pid")."""
    receiver = Receiver(free_port())
    try:
        proc = run(["app", "-f", "dc=eu1", "-c", receiver.endpoint, *endpoint_receiver_args],
                   line + b"\n")
        assert proc.returncode == 0, proc.stderr
        (event,) = events_of(receiver, 1)
    finally:
        receiver.stop()
    del event["@pid"]
    return event


@pytest.mark.parametrize("corpus", [
    HOSTILE,  # invalid UTF-8 in the read: every line parsed on its own
    [(line, want) for line, want in HOSTILE if want != "invalid UTF-8"],  # parsed in one go
    [(line, want) for line, want in HOSTILE if isinstance(want, dict)],  # and spliced so
], ids=["all", "utf8", "objects"])
def test_hostile_corpus_each_line_merged_or_sent_as_text_with_why(receiver, corpus):
    data = b"".join(line + b"\n" for line, _ in corpus)
    proc = run(["app", "--json", "-f", "dc=eu1", "-c", receiver.endpoint], data)
    assert proc.returncode == 0, proc.stderr
    events = events_of(receiver, len(corpus))
    assert len(events) == len(corpus)
    pid = int(proc.stderr.decode().rsplit("@pid:", 1)[1].split(".")[0])
    failures = 0
    for (line, want), event in zip(corpus, events):
        ours = {"type": "app", "@pid": pid, "dc": "eu1"}
        if isinstance(want, dict):
            assert event == {**want, **ours}, line
            continue
        failures += 1
        assert event == {"message": line.decode("utf-8", "replace"), **ours,
                         "tags": ["_jsonparsefailure"], "@json_error": want}, line
    if failures:
        assert zmqpush.json_closing(failures, 0)[:-len(" (@json_error says why)")] \
            in proc.stderr.decode()
    assert closing_count(proc.stderr) == len(corpus)


def test_a_line_sent_as_text_is_the_plain_modes_event_plus_the_mark(receiver):
    lines = [b'not "json"\\ \x01 \xff caf\xc3\xa9', b"[1,2]", b'{"x":NaN}']
    proc = run(["app", "--json", "-f", "dc=eu1", "-c", receiver.endpoint],
               b"".join(line + b"\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    for line, event in zip(lines, events_of(receiver, len(lines))):
        del event["@pid"], event["tags"], event["@json_error"]
        assert event == plain_event(line)


def test_a_merged_object_keeps_its_own_text_and_order(receiver):
    """The fast path splices the line's bytes: key order, spacing inside and number
    spelling arrive as written."""
    line = b'{"b": 1.50, "a" : [1 ,2], "u":"\\u00e9"}'
    proc = run(["app", "--json", "-c", receiver.endpoint], line + b"\n")
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    pid = int(proc.stderr.decode().rsplit("@pid:", 1)[1].split(".")[0])
    assert receiver.frames == [line[:-1] + b',"type":"app","@pid":%d}' % pid]


RESERVED = [
    (b'{"@timestamp":"2026-11-25T12:00:00.123Z","tags":"one","@version":"1",'
     b'"event":{"kind":"x"},"@metadata":{"k":1}}',
     {"@timestamp": "2026-11-25T12:00:00.123Z", "tags": "one", "@version": "1",
      "event": {"kind": "x"}}, None),
    (b'{"@timestamp":"2026-11-25T12:00:00+01:00","tags":["a","b"]}',
     {"@timestamp": "2026-11-25T12:00:00+01:00", "tags": ["a", "b"]}, None),
    (b'{"@timestamp":1764072000}', {"_@timestamp": 1764072000}, ["@timestamp"]),
    (b'{"@timestamp":"yesterday"}', {"_@timestamp": "yesterday"}, ["@timestamp"]),
    (b'{"@timestamp":"2026-13-01T00:00:00Z"}', {"_@timestamp": "2026-13-01T00:00:00Z"},
     ["@timestamp"]),
    (b'{"@timestamp":"2026-02-30T00:00:00Z"}', {"_@timestamp": "2026-02-30T00:00:00Z"},
     ["@timestamp"]),  # a day that does not exist
    (b'{"@timestamp":"2025-02-29T00:00:00Z"}', {"_@timestamp": "2025-02-29T00:00:00Z"},
     ["@timestamp"]),
    (b'{"@timestamp":"2024-02-29T00:00:00Z"}', {"@timestamp": "2024-02-29T00:00:00Z"}, None),
    ('{"@timestamp":"\u0662\u0660\u0662\u0666-01-01T00:00:00Z"}'.encode(),
     {"_@timestamp": "\u0662\u0660\u0662\u0666-01-01T00:00:00Z"}, ["@timestamp"]),
    (b'{"@metadata":"s","x":1}', {"_@metadata": "s", "x": 1}, ["@metadata"]),
    (b'{"tags":[1,"a"]}', {"_tags": [1, "a"]}, ["tags"]),
    (b'{"tags":{"a":1}}', {"_tags": {"a": 1}}, ["tags"]),
    (b'{"@version":1}', {"_@version": 1}, ["@version"]),
    (b'{"event":"started"}', {"_event": "started"}, ["event"]),
    (b'{"event":["a"],"@version":null}', {"_event": ["a"], "_@version": None},
     ["@version", "event"]),
]


def test_reserved_keys_logstash_would_refuse_are_moved_and_said(receiver):
    proc = run(["app", "--json", "-c", receiver.endpoint],
               b"".join(line + b"\n" for line, _, _ in RESERVED))
    assert proc.returncode == 0, proc.stderr
    events = events_of(receiver, len(RESERVED))
    fixed = 0
    for (line, want, moved), event in zip(RESERVED, events):
        assert event.pop("type") == "app" and isinstance(event.pop("@pid"), int)
        event.pop("@metadata", None)  # stays zmqpush's: Logstash takes it as metadata
        error = event.pop("@json_error", None)
        assert event == want, line
        if moved is None:
            assert error is None, line
            continue
        fixed += 1
        assert error == "; ".join(
            f"{key} {why}: kept as _{key}" for key, why in (
                (k, {"@timestamp": "not an ISO 8601 time with its zone",
                     "@metadata": "not an object", "@version": "not a string",
                     "tags": "not a string or a list of strings",
                     "event": "not an object"}[k]) for k in moved)), line
    assert zmqpush.json_closing(0, fixed)[2:] in proc.stderr.decode()


def test_zmqpush_keys_win_unless_overwrite_and_no_app_value_is_lost(receiver):
    line = (b'{"type":"mine","@pid":1,"dc":"x","host":"h","@timestamp":"2020-01-01T00:00:00Z",'
            b'"@metadata":{"_id":"theirs","k":1},"keep":true}\n')
    args = ["app", "--json", "-f", "dc=eu1", "--host-field", "--timestamp", "--event-id",
            "-c", receiver.endpoint]
    assert run(args, line).returncode == 0
    assert run([*args, "--json-overwrite"], line).returncode == 0
    ours, theirs = events_of(receiver, 2)
    assert ours["type"] == "app" and ours["dc"] == "eu1" and ours["@pid"] != 1
    assert ours["host"] != "h" and ours["@metadata"]["_id"].endswith("-0")
    assert ours["@metadata"]["k"] == 1 and ours["keep"] is True
    assert ours["@json_replaced"] == {"type": "mine", "@pid": 1, "dc": "x", "host": "h",
                                      "@metadata": {"_id": "theirs"}}
    assert "@json_error" not in ours
    for event in (ours, theirs):  # the app's valid time is the event's; the read time kept
        assert event["@timestamp"] == "2020-01-01T00:00:00Z"
        assert event["event"]["created"].startswith("20") and \
            event["event"]["created"] != "2020-01-01T00:00:00Z"
    assert {k: theirs[k] for k in ("type", "@pid", "dc", "host")} == {
        "type": "mine", "@pid": 1, "dc": "x", "host": "h"}
    assert theirs["@metadata"] == {"_id": "theirs", "k": 1}
    assert "@json_replaced" not in theirs


def test_an_app_s_own_json_replaced_goes_under_zmqpush_s(receiver):
    """"@json_replaced" is zmqpush's key, as "@json_error" is, with or without
    --json-overwrite: an app's own (not an object) is kept under it by its own
    key, beside the app's values that zmqpush's keys replaced, if any."""
    lines = b'{"message":"m","@json_replaced":"app text"}\n{"type":"audit","@json_replaced":7}\n'
    args = ["app", "--json", "-c", receiver.endpoint]
    assert run(args, lines).returncode == 0
    assert run([*args, "--json-overwrite"], lines).returncode == 0
    first, second, over_first, over_second = events_of(receiver, 4)
    assert first["@json_replaced"] == {"@json_replaced": "app text"} and first["message"] == "m"
    assert second["@json_replaced"] == {"type": "audit", "@json_replaced": 7}
    assert second["type"] == "app"
    assert over_first["@json_replaced"] == {"@json_replaced": "app text"}
    assert over_second["@json_replaced"] == {"@json_replaced": 7} and over_second["type"] == "audit"


def test_target_key_and_message_key(receiver):
    lines = [b'{"msg":"hello","level":"info","type":"t"}', b'{"level":"debug"}',
             b'{"msg":7}', b"not json"]
    proc = run(["app", "--json", "--json-target", "app", "--json-message-key", "msg",
                "-c", receiver.endpoint], b"".join(line + b"\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    events = events_of(receiver, len(lines))
    for event in events:
        assert event.pop("type") == "app" and isinstance(event.pop("@pid"), int)
    assert events[0] == {"app": {"level": "info", "type": "t"}, "message": "hello"}
    assert events[1] == {"app": {"level": "debug"}}
    assert events[2] == {"app": {"msg": 7}}  # not a string: not a message
    assert events[3]["message"] == "not json" and events[3]["@json_error"] == "not JSON"

    proc = run(["app", "--json", "--json-message-key", "msg", "-c", receiver.endpoint],
               b'{"msg":"hi","message":"old","x":1}\n')
    assert proc.returncode == 0, proc.stderr
    event = events_of(receiver, len(lines) + 1)[-1]
    assert (event["message"], event["x"], "msg" in event) == ("hi", 1, False)


def test_batch_event_ids_and_timestamp(receiver):
    lines = [b'{"i":%d}' % i if i % 3 else b"text %d" % i for i in range(300)]
    lines[7] = b'{"@metadata":{"k":7},"i":7}'
    proc = run(["app", "--json", "--batch", "--event-id", "--timestamp",
                "-c", receiver.endpoint], b"".join(line + b"\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    receiver.wait_for(1)
    receiver.settle(0.5)
    events = receiver.events()
    assert len(events) == len(lines)
    assert all(frame.startswith(b"[") for frame in receiver.frames)
    assert len(receiver.frames) < len(lines)
    ids = [e["@metadata"]["_id"] for e in events]
    run_id = ids[0].rsplit("-", 1)[0]
    assert ids == [f"{run_id}-{n}" for n in range(len(lines))]
    assert events[7]["@metadata"]["k"] == 7
    for n, event in enumerate(events):
        assert event["@timestamp"].endswith("Z")
        if n % 3 and n != 7:
            assert event["i"] == n and "message" not in event
        elif n % 3 == 0:
            assert event["message"] == f"text {n}" and event["@json_error"] == "not JSON"


def test_cut_long_line_goes_as_marked_pieces_and_the_next_line_is_merged(receiver):
    long_object = b'{"k":"' + b"x" * 300 + b'"}'
    lines = [b'{"before":1}', long_object, b'{"after":2}']
    proc = run(["app", "--json", "--max-line-bytes", "100", "-c", receiver.endpoint],
               b"".join(line + b"\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    events = events_of(receiver, 6)
    assert events[0]["before"] == 1 and events[-1]["after"] == 2
    pieces = events[1:-1]
    assert len(pieces) == 4
    assert "".join(p["message"] for p in pieces).encode() == long_object
    assert [p.get("@continues", False) for p in pieces] == [True, True, True, False]
    assert {p["@json_error"] for p in pieces} == {"line cut at --max-line-bytes"}
    assert all(p["tags"] == ["_jsonparsefailure"] for p in pieces)


def test_confirm_answers_every_line_merged_or_not(receiver):
    lines = [b'{"a":1}', b"text", b'{"b":' + b"y" * 50 + b"}", b'{"c":3}']
    proc = run(["app", "--json", "--confirm", "--max-line-bytes", "16",
                "-c", receiver.endpoint], b"".join(line + b"\n" for line in lines))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == b"OK\n" * (len(lines) + 1)
    events = events_of(receiver, 4)
    assert events[0]["a"] == 1 and events[-1]["c"] == 3
    assert events[1]["@json_error"] == "not JSON"


def test_spool_keeps_merged_events_for_the_next_run(tmp_path):
    """The first run has no receiver and leaves everything in the spool; the
    second sends it first, as encoded then, then its own lines."""
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    spool = str(tmp_path / "spool")
    first = run(["app", "--json", "--event-id", "--spool", spool, "--linger", "0.2",
                 "-c", endpoint], b'{"run":1}\nfirst text\n')
    assert first.returncode == 3, first.stderr
    receiver = Receiver(port)
    try:
        second = run(["app", "--json", "--spool", spool, "-c", endpoint], b'{"run":2}\n')
        assert second.returncode == 0, second.stderr
        events = events_of(receiver, 3)
    finally:
        receiver.stop()
    assert [e.get("run") for e in events] == [1, None, 2]
    assert events[1]["message"] == "first text" and events[1]["@json_error"] == "not JSON"
    assert events[0]["@metadata"]["_id"].endswith("-0")


def test_replay_after_the_receiver_goes_away_resends_merged_events():
    """A receiver that goes away mid-flow: what may have been in flight is sent
    again to the next one, as the merged events it was, with the same ids."""
    lines = 100_000
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    first = Receiver(port)
    second = None
    proc = start(["app", "--json", "--event-id", "-c", endpoint])
    writer = threading.Thread(target=lambda: (proc.stdin.write(b"".join(
        b'{"i":%d}\n' % n for n in range(lines))), proc.stdin.close()), daemon=True)
    try:
        writer.start()
        assert first.wait_for(lines // 10, 30) >= lines // 10
        first.stop()
        time.sleep(0.3)
        second = Receiver(port)
        assert proc.wait(60) == 0, proc.stderr.read()
        second.settle(0.5)
        events = [json.loads(f) for f in first.frames + second.frames]
        stderr = proc.stderr.read().decode()
    finally:
        stop_process(proc)
        first.stop()
        if second is not None:
            second.stop()
    assert {e["i"] for e in events} == set(range(lines))
    assert "Replayed " in stderr, stderr
    assert int(stderr.split("Replayed ")[1].split()[0]) > 0 and len(events) > lines
    ids = {}
    for event in events:
        assert event["type"] == "app" and set(event) == {"i", "type", "@pid", "@metadata"}
        assert ids.setdefault(event["i"], event["@metadata"]["_id"]) == event["@metadata"]["_id"]


def test_counters_in_stats_and_sigusr1(receiver):
    proc = start(["app", "--json", "--stats-format", "json", "-c", receiver.endpoint])
    try:
        proc.stdin.write(b'{"a":1}\nnot json\n[1]\n{"@version":2}\n')
        proc.stdin.flush()
        assert receiver.wait_for(4) == 4
        os.kill(proc.pid, signal.SIGUSR1)
        time.sleep(0.3)
        proc.stdin.close()
        assert proc.wait(10) == 0
        stats = [json.loads(line) for line in proc.stderr.read().splitlines()
                 if line.startswith(b"{")]
    finally:
        stop_process(proc)
    assert (stats[0]["json_errors"], stats[0]["json_fixed"]) == (2, 1)


def test_plain_mode_sends_a_json_line_as_a_string_as_before(receiver):
    proc = run(["-c", receiver.endpoint, "--stats-format", "json"], b'{"a":1}\n')
    assert proc.returncode == 0
    assert receiver.wait_for(1) == 1
    pid = int(proc.stderr.decode().rsplit("@pid:", 1)[1])
    assert receiver.frames == [b'{"message":"{\\"a\\":1}","type":"syslog","@pid":%d}' % pid]
    assert b"JSON" not in proc.stderr


@pytest.mark.parametrize("line", [b'{"tags":[1],"n":1e400}', b'{"msg":"m","n":-1e999}',
                                  b'{"n":1e400,"s":"\\ud83d\\ude00"}'],
                         ids=["reserved-key", "message-key", "surrogate-pair"])
def test_a_number_out_of_range_is_sent_as_text_and_the_run_goes_on(receiver, line):
    """1e400 parses as infinity, which JSON cannot carry: the line goes as text."""
    proc = run(["app", "--json", "--json-message-key", "msg", "-c", receiver.endpoint],
               line + b"\n" + b'{"after":1}\n')
    assert proc.returncode == 0, proc.stderr
    failed, after = events_of(receiver, 2)
    assert failed["message"] == line.decode()
    assert failed["@json_error"] == "a number out of range"
    assert after["after"] == 1


@pytest.mark.parametrize("args", [
    ["--json", "-f", "@json_error=x"], ["--json", "--json-target", "@json_error"],
    ["--json-target", "x"], ["--json-message-key", "m"], ["--json-overwrite"],
    ["--json", "--journal"], ["--json", "--json-target", "type"],
    ["--json", "--json-target", "dc", "-f", "dc=1"], ["--json", "--json-target", ""],
    ["--json", "--json-message-key", "message"],
])
def test_options_that_do_not_fit_are_usage_errors(args):
    proc = run(args, b"")
    assert proc.returncode == 2, proc.stderr
    assert unstamped(proc.stderr).startswith(b"zmqpush: ") and b"Traceback" not in proc.stderr


def test_environment_twins(receiver):
    proc = run(["-c", receiver.endpoint], b'{"msg":"m","a":1}\n',
               env={"ZMQPUSH_JSON": "1", "ZMQPUSH_JSON_TARGET": "app",
                    "ZMQPUSH_JSON_MESSAGE_KEY": "msg"})
    assert proc.returncode == 0, proc.stderr
    (event,) = events_of(receiver, 1)
    assert (event["message"], event["app"]) == ("m", {"a": 1})


# ------------------------------------------------------------------ journald --
JOURNAL_REMOTE = "/lib/systemd/systemd-journal-remote"
BOOT_ID = "0123456789abcdef0123456789abcdef"
FIRST_MICROS = 1764072000000000


def export_entry(fields: list) -> bytes:
    """One entry of the journal export format: KEY=VALUE lines, binary-safe
    KEY\\n<le64 size><data>\\n for values with newlines or control bytes."""
    out = b""
    for key, value in fields:
        if all(32 <= c < 127 or c >= 128 for c in value) and b"\n" not in value:
            out += key + b"=" + value + b"\n"
        else:
            out += key + b"\n" + len(value).to_bytes(8, "little") + value + b"\n"
    return out + b"\n"


JOURNAL_ENTRIES = [
    [(b"MESSAGE", b"hello %d" % i), (b"PRIORITY", b"6"), (b"SYSLOG_IDENTIFIER", b"app"),
     (b"_PID", b"42"), (b"_HOSTNAME", b"web1"), (b"_SYSTEMD_UNIT", b"app.service"),
     (b"SYSLOG_FACILITY", b"3")] for i in range(3)
] + [
    [(b"MESSAGE", b"bin\xff\x01 line\nnext"), (b"TAG", b"a"), (b"TAG", b"b"),
     (b"BIG", b"x" * 5000), (b"PRIORITY", b"3"), (b"SYSLOG_IDENTIFIER", b"one"),
     (b"SYSLOG_IDENTIFIER", b"two")],
    [(b"MESSAGE", b"m" * 5000), (b"SYSLOG_IDENTIFIER", b"big")],
]


def journal_file(tmp_path) -> str:
    """A real journal file of JOURNAL_ENTRIES, written by systemd-journal-remote."""
    if not os.path.exists(JOURNAL_REMOTE):
        pytest.fail(f"{JOURNAL_REMOTE} is missing: .ci/run installs systemd-journal-remote")
    data = b"".join(export_entry([
        (b"__REALTIME_TIMESTAMP", b"%d" % (FIRST_MICROS + n * 1001)),
        (b"__MONOTONIC_TIMESTAMP", b"%d" % (1000 + n)), (b"_BOOT_ID", BOOT_ID.encode()),
        *fields]) for n, fields in enumerate(JOURNAL_ENTRIES))
    path = str(tmp_path / "F.journal")
    subprocess.run([JOURNAL_REMOTE, "-o", path, "-"], input=data, check=True,
                   capture_output=True, timeout=30)
    return path


def journalctl(path: str, *args) -> bytes:
    return subprocess.run(["journalctl", "--file", path, "-o", "json", *args],
                          capture_output=True, check=True, timeout=30).stdout


def iso(micros: int) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(micros // 10**6)) + \
        f".{micros % 10**6:06d}Z"


@pytest.mark.parametrize("full", [True, False], ids=["all", "without-all"])
def test_journalctl_json_of_a_real_journal_file(tmp_path, receiver, full):
    path = journal_file(tmp_path)
    entries = journalctl(path, *(["--all"] if full else []))
    cursors = [json.loads(line)["__CURSOR"] for line in entries.splitlines()]
    assert len(cursors) == len(JOURNAL_ENTRIES)
    proc = run(["journal", "--journal", "-c", receiver.endpoint], entries)
    assert proc.returncode == 0, proc.stderr
    events = events_of(receiver, len(JOURNAL_ENTRIES))
    for n, event in enumerate(events):
        assert event["type"] == "journal" and event["@metadata"] == {"_id": cursors[n]}
        assert event["@timestamp"] == iso(FIRST_MICROS + n * 1001)
        rest = event["journald"]
        assert rest["_BOOT_ID"] == BOOT_ID and rest["__MONOTONIC_TIMESTAMP"] == str(1000 + n)
        assert "MESSAGE" not in rest and "__CURSOR" not in rest
    for n in range(3):
        assert {k: events[n][k] for k in ("message", "severity", "facility", "program",
                                           "pid", "logsource", "unit")} == {
            "message": f"hello {n}", "severity": 6, "facility": 3, "program": "app",
            "pid": 42, "logsource": "web1", "unit": "app.service"}
    binary = events[3]
    assert binary["message"] == "bin\ufffd\x01 line\nnext"  # journalctl's byte array
    assert binary["journald"]["TAG"] == ["a", "b"]  # a repeated field
    assert binary["severity"] == 3
    # a repeated field that has a name of its own: its first value, all of them kept
    assert binary["program"] in ("one", "two")
    assert sorted(binary["journald"]["SYSLOG_IDENTIFIER"]) == ["one", "two"]
    big = events[4]
    if full:
        assert binary["journald"]["BIG"] == "x" * 5000 and big["message"] == "m" * 5000
        assert "@json_error" not in big
    else:  # journalctl writes null for fields over 4096 bytes
        assert binary["journald"]["BIG"] is None and "message" not in big
        assert big["@json_error"].startswith("MESSAGE is null")
    assert big["program"] == "big"


def test_journal_numbers_too_long_for_an_integer_stay_text(receiver):
    """int() refuses over 4,300 digits: such a field must not stop the run (a
    restart would read the same entry again, for good)."""
    digits = "7" * 5000
    entry = json.dumps({"MESSAGE": "m", "PRIORITY": digits, "_PID": digits,
                        "__REALTIME_TIMESTAMP": digits, "__CURSOR": "c1"}).encode()
    proc = run(["j", "--journal", "-c", receiver.endpoint], entry + b"\n" + entry + b"\n")
    assert proc.returncode == 0, proc.stderr
    for event in events_of(receiver, 2):
        assert event["message"] == "m" and event["severity"] == digits
        assert event["pid"] == digits and "@timestamp" not in event


def test_journal_with_ecs_names(tmp_path, receiver):
    path = journal_file(tmp_path)
    proc = run(["journal", "--journal", "--host-field-ecs", "--event-id",
                "-c", receiver.endpoint], journalctl(path, "--all"))
    assert proc.returncode == 0, proc.stderr
    event = events_of(receiver, len(JOURNAL_ENTRIES))[0]
    assert event["log"] == {"syslog": {"severity": {"code": 6}, "facility": {"code": 3},
                                       "appname": "app"}}
    assert event["process"] == {"pid": 42} and event["systemd"] == {"unit": "app.service"}
    assert event["host"]["hostname"] == "web1" and event["host"]["name"]
    assert event["@metadata"]["_id"].startswith("s=")  # the cursor, not RUN-SEQ


@pytest.mark.parametrize("spool", [False, True], ids=["memory", "spool"])
def test_journal_restart_loses_what_journalctl_printed_unless_spooled(tmp_path, spool):
    """journalctl --cursor-file saves the cursor of what it printed: what zmqpush
    read but did not deliver is never printed again.  Only --spool keeps it."""
    path = journal_file(tmp_path)
    cursor_file = str(tmp_path / "cursor")
    port = free_port()
    endpoint = f"tcp://127.0.0.1:{port}"
    args = ["journal", "--journal", "-c", endpoint,
            *(["--spool", str(tmp_path / "spool")] if spool else [])]
    first = run([*args, "--linger", "0.2"],
                journalctl(path, "--all", f"--cursor-file={cursor_file}"))
    assert first.returncode == 3, first.stderr  # no receiver: not delivered
    receiver = Receiver(port)
    try:
        again = journalctl(path, "--all", f"--cursor-file={cursor_file}")
        assert again == b""  # journalctl goes on after what it printed
        second = run(args, again)
        assert second.returncode == 0, second.stderr
        receiver.settle(1.0)
        events = receiver.events()
    finally:
        receiver.stop()
    if spool:
        assert [e["message"] for e in events[:3]] == [f"hello {n}" for n in range(3)]
        assert len(events) == len(JOURNAL_ENTRIES)
    else:
        assert events == []


# ------------------------------------------------------------------- rsyslog --
# README "Structured logs": rsyslog hands zmqpush each message as one JSON object.
RSYSLOG_TEMPLATE = """\
template(name="zmqpush_json" type="list" option.jsonf="on") {
  property(outname="@timestamp" name="timereported" dateFormat="rfc3339" format="jsonf")
  property(outname="logsource" name="hostname" format="jsonf")
  property(outname="program" name="programname" format="jsonf")
  property(outname="pid" name="procid" format="jsonf")
  property(outname="severity" name="syslogseverity-text" format="jsonf")
  property(outname="facility" name="syslogfacility-text" format="jsonf")
  property(outname="message" name="msg" format="jsonf")
}
"""

SYSLOG_IN = [
    (b'<13>1 2026-11-25T12:00:00.123+01:00 web1 app 4242 - - hello "world" caf\xc3\xa9',
     {"@timestamp": "2026-11-25T12:00:00.123+01:00", "logsource": "web1", "program": "app",
      "pid": "4242", "severity": "notice", "facility": "user",
      "message": 'hello "world" café'}),
    (b"<11>1 2026-11-25T12:00:01Z web2 db - - - tab\there \\ back",
     {"@timestamp": "2026-11-25T12:00:01Z", "logsource": "web2", "program": "db",
      "pid": "-", "severity": "err", "facility": "user", "message": "tab\there \\ back"}),
    (b'<134>1 2026-11-25T12:00:02.5Z web3 nginx 7 - - {"a":1}',
     {"@timestamp": "2026-11-25T12:00:02.5Z", "logsource": "web3", "program": "nginx",
      "pid": "7", "severity": "info", "facility": "local0", "message": '{"a":1}'}),
]


@pytest.mark.parametrize("confirm", [False, True], ids=["plain", "confirm"])
def test_rsyslog_json_template_delivers_syslog_fields(tmp_path, confirm):
    assert available(), "rsyslogd is not installed: .ci/run installs Debian's rsyslog"
    receiver = Receiver(free_port())
    binary = " ".join([ZMQPUSH, "syslog", "--json", *(["--confirm"] if confirm else []),
                       "-c", receiver.endpoint])
    action = (f'action(type="omprog" binary="{binary}" template="zmqpush_json" '
              f'output="{tmp_path}/zmqpush.err"'
              + (' confirmMessages="on"' if confirm else "") + ")")
    rs = PrivateRsyslog(tmp_path / "rsyslog", action,
                        modules='module(load="omprog")\n' + RSYSLOG_TEMPLATE)
    try:
        rs.start()
        with socket.create_connection(("127.0.0.1", rs.port)) as conn:
            conn.sendall(b"".join(frame + b"\n" for frame, _ in SYSLOG_IN))
        assert receiver.wait_for(len(SYSLOG_IN), 30) == len(SYSLOG_IN)
        events = receiver.events()
    finally:
        rs.stop()
        receiver.stop()
    for (_, want), event in zip(SYSLOG_IN, events):
        assert event.pop("type") == "syslog" and isinstance(event.pop("@pid"), int)
        assert event == want
