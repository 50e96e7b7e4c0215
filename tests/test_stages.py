"""The reading pipeline's stages, each fed directly (no process, no socket):
the framer, the Joiner with each rule and the per-source view, the encoders,
--confirm's Ledger, the pipeline itself and the sink interface that the
memory queue and the spool share.  Milliseconds each."""
import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zmqpush

TRACE = [b"Traceback (most recent call last):", b'  File "a.py", line 1, in <module>',
         b"    f()", b"ValueError: bad"]


def lines_of(items: list) -> list:
    """What items carry, as (kind, text, lines, held): a run's lines one by
    one, a Joined's events one by one."""
    out = []
    for item in items:
        if item.joins:
            for text, cut, count in zip(item.texts, item.cut, item.lines):
                out.append(("event", text, count, cut))
        else:
            out += [("line", line, 1, item.continues)
                    for line in item.lines.split(b"\n")[:-1]]
    return out


def joiner(rule, max_lines=500, max_bytes=1 << 20, clock=lambda: 0.0):
    return zmqpush.Joiner(rule, max_lines, max_bytes, zmqpush.Counters(), clock=clock)


def chunk(lines) -> bytes:
    return b"".join(line + b"\n" for line in lines)


# ------------------------------------------------------------------ framer --

def test_framer_keeps_the_unfinished_line_and_cuts_long_ones():
    framer = zmqpush.LineFramer(8)
    assert framer.feed(b"ab\ncd") == [zmqpush.Segment(b"ab\n")]
    segments = framer.feed(b"efghijklmn\nx\n")
    assert [(s.lines, s.continues) for s in segments] == [
        (b"cdefghij\n", True), (b"klmn\n", False), (b"x\n", False)]
    assert framer.feed(b"tail") == [] and framer.finish() == [
        zmqpush.Segment(b"tail\n", strip_cr=False)]
    assert framer.finish() == []


@pytest.mark.parametrize("reads", [1, 7])
def test_framer_cuts_every_piece_of_a_line_over_its_limit_at_piece_bytes(reads):
    """--docker, --cri: lines up to the framer's limit come whole, a longer
    one in pieces of piece_bytes, its tail too (fed at once or in reads)."""
    framer = zmqpush.LineFramer(12, 5)
    data = b"0123456789ab\n" + b"x" * 23 + b"\n" + b"y" * 14
    step = -(-len(data) // reads)
    segments = [seg for start in range(0, len(data), step)
                for seg in framer.feed(data[start:start + step])] + framer.finish()
    assert [(s.lines, s.continues) for s in segments if b"x" in s.lines] == [
        (b"xxxxx\n", True)] * 4 + [(b"xxx\n", False)]
    assert segments[0].lines == b"0123456789ab\n"
    assert b"".join(s.lines[:-1] for s in segments if b"y" in s.lines) == b"y" * 14
    assert all(len(s.lines) <= 6 for s in segments[1:])


def test_framer_never_cuts_between_a_cr_and_what_follows_it():
    """A cut that would end a piece with CR ends it one byte sooner: the CR goes
    with what follows it (a CRLF split across pieces would keep its CR)."""
    framer = zmqpush.LineFramer(8)
    assert [(s.lines, s.continues) for s in framer.feed(b"abcdefg\rhij\n")] == [
        (b"abcdefg\n", True), (b"\rhij\n", False)]


# ------------------------------------------------------------------ joiner --

def test_python_rule_joins_a_trace_between_plain_lines():
    join = joiner(zmqpush.PythonRule())
    out = join.feed(chunk([b"before", *TRACE, b"1 after"]))
    assert lines_of(out) == [("line", b"before", 1, False),
                             ("event", b"\n".join(TRACE), 4, False),
                             ("line", b"1 after", 1, False)]
    assert join.pending() == 0 and join.flush() == []


def test_java_go_ruby_rules_join_their_traces():
    java = [b"java.lang.IllegalStateException: x", b"\tat a.b.C.d(C.java:1)",
            b"Caused by: java.io.IOException: y", b"\tat e.f(G.java:2)", b"\t... 3 more"]
    go = [b"panic: oops", b"", b"goroutine 1 [running]:", b"main.main()", b"\t/x.go:3 +0x1"]
    ruby = [b"t.rb:2:in `inner': failure (ArgumentError)", b"\tfrom t.rb:5:in `outer'"]
    for rule, trace in ((zmqpush.JavaRule(), java), (zmqpush.GoRule(), go),
                        (zmqpush.RubyRule(), ruby)):
        join = joiner(rule)
        out = join.feed(chunk([b"plain", *trace, b"plain"])) + join.flush()
        assert lines_of(out) == [("line", b"plain", 1, False),
                                 ("event", b"\n".join(trace), len(trace), False),
                                 ("line", b"plain", 1, False)], rule


def test_pattern_rule_after_and_before():
    after = joiner(zmqpush.PatternRule(zmqpush.re.compile(rb"^\s"), False, True))
    out = after.feed(chunk([b"head", b" more", b" more", b"next"])) + after.flush()
    assert lines_of(out) == [("event", b"head\n more\n more", 3, False),
                             ("line", b"next", 1, False)]
    before = joiner(zmqpush.PatternRule(zmqpush.re.compile(rb"\\$"), False, False))
    out = before.feed(chunk([b"a \\", b"b \\", b"c", b"d"])) + before.flush()
    assert lines_of(out) == [("event", b"a \\\nb \\\nc", 3, False), ("line", b"d", 1, False)]


def pattern_messages(data: bytes, *args) -> list:
    """The messages the Joiner makes of data with the rule these --multiline-pattern
    options name, parsed as the command line parses them."""
    multiline = zmqpush.parse_options(["-q", *args], {}).multiline
    joined = joiner(zmqpush.joining_rule(multiline), multiline.max_lines, multiline.max_bytes)
    return [text.decode() for _, text, _, _ in lines_of(joined.feed(data) + joined.flush())]


@pytest.mark.parametrize("args, expected", [
    (["--multiline-pattern", "NEVER-THERE"], ["a", " b", " c", "d"]),
    (["--multiline-pattern", "^ "], ["a\n b\n c", "d"]),
    (["--multiline-pattern", "^[a-z]", "--multiline-negate"], ["a\n b\n c", "d"]),
    (["--multiline-pattern", "^ ", "--multiline-match", "before"], ["a", " b\n c\nd"]),
], ids=["never", "after", "negate", "before"])
def test_pattern_follows_filebeat_s_negate_and_match(args, expected):
    assert pattern_messages(b"a\n b\n c\nd\n", *args) == expected


def test_the_pattern_sees_only_the_first_bytes_of_a_line():
    """A pattern is matched on a line's first 256 bytes: what a slow pattern
    costs per line is bounded, whatever the line's length."""
    near, far = b" " * 10 + b"MARK", b" " * 300 + b"MARK"
    assert pattern_messages(b"head\n" + near + b"\n" + far + b"\n",
                            "--multiline-pattern", "MARK") == ["head\n" + near.decode(),
                                                               far.decode()]


def test_joiner_cuts_at_its_line_cap_and_says_held_lines():
    join = joiner(zmqpush.PythonRule(), max_lines=3)
    assert join.feed(chunk(TRACE[:2])) == [] and join.pending() == 2
    out = join.feed(chunk(TRACE[2:]))
    assert lines_of(out) == [("event", b"\n".join(TRACE[:3]) + b"\n", 3, True)]
    assert out[0].held == 2  # two of its lines were held before this call
    out = join.flush()
    assert lines_of(out) == [("line", TRACE[3], 1, False)] and out[0].held == 1


@pytest.mark.parametrize("caps", [(500, 1 << 20), (3, 1 << 20), (500, 150), (2, 40)])
def test_joiner_s_pieces_concatenated_are_the_lines_as_they_came(caps):
    """"@continues" has one meaning (issue 35): an event cut at a cap ends with
    the newline after its last line, so the pieces, concatenated, give back
    the bytes, as an over-long line's pieces do."""
    trace = [b"java.lang.StackOverflowError: deep"] + [
        b"\tat Deep.recurse(Deep.java:%d)" % n for n in range(1200)]
    join = joiner(zmqpush.JavaRule(), *caps)
    events = lines_of(join.feed(chunk([*trace, b"1 next"])) + join.flush())
    assert events[-1] == ("line", b"1 next", 1, False)
    pieces = events[:-1]
    assert len(pieces) > 1 and [cut for *_, cut in pieces] == [True] * (len(pieces) - 1) + [False]
    assert b"".join(text for _, text, *_ in pieces) == b"\n".join(trace)
    assert all(text.endswith(b"\n") for _, text, *_ in pieces[:-1])


def test_joiner_holds_no_tentative_line_past_its_line_cap():
    """Blank lines after a Go panic are held until the next line tells; the
    pending event and those held lines together stay within --multiline-max-lines:
    one more and the event ends, the held lines leaving as lines of their own."""
    join = joiner(zmqpush.GoRule(), max_lines=3)
    assert join.feed(chunk([b"panic: x", b"", b""])) == [] and join.pending() == 3
    out = join.feed(chunk([b""]))
    assert lines_of(out) == [("line", b"panic: x", 1, False)] + [("line", b"", 1, False)] * 3
    assert join.pending() == 0


def test_joiner_quiet_timer_is_its_last_line_plus_the_timeout():
    now = [10.0]
    join = joiner(zmqpush.PythonRule(), clock=lambda: now[0])
    assert join.quiet_at(3.0) is None
    join.feed(chunk(TRACE[:2]))
    assert join.quiet_at(3.0) == 13.0
    assert join.flush_quiet(12.9, 3.0) == []
    assert lines_of(join.flush_quiet(13.0, 3.0)) == [("event", b"\n".join(TRACE[:2]), 2, False)]


def test_per_source_view_joins_each_source_apart():
    def line(source, message):
        return json.dumps({"src": source, "message": message}).encode()
    join = zmqpush.Joiner(zmqpush.PythonRule(), 500, 1 << 20, zmqpush.Counters(),
                          clock=lambda: 0.0, view=zmqpush.ObjectView(("src",)))
    mixed = []
    for a, b in zip(TRACE, TRACE):
        mixed += [line("a", a.decode()), line("b", b.decode())]
    out = join.feed(chunk([*mixed, line("a", "1 after")]))
    assert join.pending() == 4  # b's trace is still pending
    events = lines_of(out)
    assert [kind for kind, *_ in events] == ["event", "line"]
    assert json.loads(events[0][1]) == {"src": "a", "message": "\n".join(
        t.decode() for t in TRACE)}
    flushed = lines_of(join.flush())
    assert json.loads(flushed[0][1])["src"] == "b" and flushed[0][2] == 4


def test_per_source_view_says_which_lines_were_held_before():
    """Fed a line at a time (as --confirm's Ledger feeds it), each item says
    how many of its lines an earlier call held: the line just fed is never
    among them."""
    def line(source, message):
        return json.dumps({"src": source, "message": message}).encode() + b"\n"
    join = zmqpush.Joiner(zmqpush.PythonRule(), 500, 1 << 20, zmqpush.Counters(),
                          clock=lambda: 0.0, view=zmqpush.ObjectView(("src",)))
    for text in TRACE:
        assert join.feed(line("a", text.decode())) == []
    assert join.holding() == [line("a", t.decode())[:-1] for t in TRACE]
    out = join.feed(line("a", "1 after"))
    assert [(item.nlines(), item.held) for item in out] == [(4, 4), (1, 0)]


def test_per_source_view_pushes_out_the_oldest_event_past_its_caps(monkeypatch):
    """Past the sources or the bytes an ObjectView allows, the event that
    began first leaves unfinished: marked cut, counted pushed out."""
    def line(source, message):
        return json.dumps({"src": source, "message": message}).encode()
    lines = [line(s, t.decode()) for s in "abc" for t in TRACE[:2]]
    four = sum(len(held) + zmqpush.MULTILINE_LINE_OVERHEAD for held in lines[:4])
    for caps in ((2, 1 << 20), (10, four)):  # two sources pending, or four lines held
        monkeypatch.setattr(zmqpush.ObjectView, "caps", caps)
        counters = zmqpush.Counters()
        join = zmqpush.Joiner(zmqpush.PythonRule(), 500, 1 << 20, counters,
                              clock=lambda: 0.0, view=zmqpush.ObjectView(("src",)))
        out = join.feed(chunk(lines))
        assert [(json.loads(text)["src"], n, cut) for _, text, n, cut in lines_of(out)] == [
            ("a", 2, True)], caps
        assert json.loads(lines_of(out)[0][1])["message"] == "\n".join(
            t.decode() for t in TRACE[:2]) + "\n"
        assert counters.events_pushed_out == 1 and join.pending() == 4
        assert join.holding() == lines[2:]


# ---------------------------------------------------------------- encoders --

def test_encoders_make_one_event_per_line():
    plain = zmqpush.Encoder(b"t", 7, batch=False)
    assert plain.encode(b"a\n\xff\n")[0] == [b'{"message":"a","type":"t","@pid":7}',
                                             b'{"message":"\xef\xbf\xbd","type":"t","@pid":7}']
    structured = zmqpush.JsonEncoder(b"t", 7, batch=False)
    (event,), _ = structured.encode(b'{"a":1}\n')
    assert json.loads(event) == {"a": 1, "type": "t", "@pid": 7}
    (joined,), _ = plain.encode_events([b"x\ny"], [True])
    assert json.loads(joined) == {"message": "x\ny", "type": "t", "@pid": 7,
                                  "@continues": True}


def test_every_encoder_takes_its_own_keys_from_one_builder():
    """OwnKeys builds type, @pid, fields, @timestamp, @continues and the event
    id; each encoder's events carry them alike, ids counted across calls."""
    keys = zmqpush.OwnKeys(b"t", 7, ((b"dc", b"eu1"),), timestamp=True, run_id="r")
    assert keys.tail(1e9, continues=True) == (
        b'"type":"t","@pid":7,"dc":"eu1","@timestamp":"2001-09-09T01:46:40.000Z",'
        b'"@continues":true')
    assert (keys.event_id(), keys.take_ids(2), keys.event_id()) == (
        b',"@metadata":{"_id":"r-0"}', 1, b',"@metadata":{"_id":"r-3"}')
    ours = {"type": "t", "@pid": 7, "dc": "eu1", "@timestamp": "2001-09-09T01:46:40.000Z"}
    for make in (zmqpush.Encoder, zmqpush.JsonEncoder, zmqpush.JournalEncoder):
        encoder = make(b"t", 7, False, ((b"dc", b"eu1"),), True, run_id="r")
        first = encoder.encode(b'{"MESSAGE":"a","message":"a"}\n', read_at=1e9)[0]
        joined = encoder.encode_events([b"x\ny"], [True], 1e9)[0]
        events = [json.loads(m) for m in first + joined]
        assert [{k: e[k] for k in ours} for e in events] == [ours, ours], make
        assert [e["@metadata"]["_id"] for e in events] == ["r-0", "r-1"], make
        assert [e.get("@continues") for e in events] == [None, True], make


def test_json_encoder_keeps_every_app_value_its_own_keys_replace():
    """The app-field rule: zmqpush's keys win (unless --json-overwrite), the
    app's values they replace go under "@json_replaced"; the app's valid
    "@timestamp" is the event's, the read time "event"."created"."""
    fields = ((b"host", b"shipper"),)
    line = (b'{"type":"audit","host":"web-3","@timestamp":"2020-01-01T00:00:00Z",'
            b'"@json_replaced":1,"@continues":"mine","@metadata":{"_id":"a","k":1}}\n')
    encoder = zmqpush.JsonEncoder(b"t", 7, batch=False, fields=fields, timestamp=True,
                                  run_id="r")
    (event,), _ = encoder.encode(line, read_at=1e9)
    assert json.loads(event) == {
        "type": "t", "host": "shipper", "@timestamp": "2020-01-01T00:00:00Z",
        "@json_replaced": {"type": "audit", "host": "web-3", "@metadata": {"_id": "a"},
                           "@continues": "mine", "@json_replaced": 1},
        "@metadata": {"_id": "r-0", "k": 1}, "@pid": 7,
        "event": {"created": "2001-09-09T01:46:40.000Z"}}
    overwrite = zmqpush.JsonEncoder(b"t", 7, batch=False, fields=fields, overwrite=True)
    (event,), _ = overwrite.encode(b'{"type":"audit","event":{"created":"x"}}\n')
    assert json.loads(event) == {"type": "audit", "event": {"created": "x"}, "@pid": 7,
                                 "host": "shipper"}


def test_json_encoder_keeps_an_app_s_own_json_replaced_under_its_own():
    """An app's "@json_replaced" that is not an object goes under zmqpush's by
    its own key, though no other value was replaced (in a chunk of lines, one
    by one, and through a container stage); an object merges one level, as a
    stage's does."""
    encoder = zmqpush.JsonEncoder(b"t", 7, batch=False)
    lines = b'{"message":"m","@json_replaced":"mine"}\n{"@json_replaced":[1]}\n' \
        b'{"@json_replaced":{"k":1}}\n'
    chunked = [json.loads(m)["@json_replaced"] for m in encoder.encode(lines)[0]]
    one_by_one = [json.loads(encoder.encode(line + b"\n")[0][0])["@json_replaced"]
                  for line in lines.split(b"\n")[:-1]]
    assert chunked == one_by_one == [{"@json_replaced": "mine"}, {"@json_replaced": [1]},
                                     {"k": 1}]
    assert zmqpush.merged_event({"@json_replaced": "x"}, {"type": "t"}, False) == {
        "@json_replaced": {"@json_replaced": "x"}, "type": "t"}


def test_json_encoder_keeps_an_app_s_own_continues_under_json_replaced():
    """"@continues" is zmqpush's mark of a cut event (a receiver joins the next
    event to it): an app's own, true or not, goes under "@json_replaced", in a
    chunk of lines and one by one, with --json-overwrite too."""
    lines = b'{"msg":"a","@continues":true}\n{"msg":"b","@continues":false}\n'
    for overwrite in (False, True):
        encoder = zmqpush.JsonEncoder(b"t", 7, batch=False, overwrite=overwrite)
        chunked = [json.loads(m) for m in encoder.encode(lines)[0]]
        one_by_one = [json.loads(encoder.encode(line + b"\n")[0][0])
                      for line in lines.split(b"\n")[:-1]]
        assert chunked == one_by_one
        assert [e.get("@continues") for e in chunked] == [None, None]
        assert [e["@json_replaced"] for e in chunked] == [{"@continues": True},
                                                          {"@continues": False}]


def test_json_encoder_keeps_the_app_message_and_error_it_replaces():
    moved = zmqpush.JsonEncoder(b"t", 7, batch=False, message_key="msg", overwrite=True)
    (event,), _ = moved.encode(b'{"msg":"m","message":"own","tags":1,"@json_error":"e"}\n')
    event = json.loads(event)
    assert (event["message"], event["_tags"]) == ("m", 1)
    assert event["@json_replaced"] == {"message": "own", "@json_error": "e"}
    assert event["@json_error"].startswith("tags not a string")


def test_journal_encoder_keeps_the_read_time_beside_the_entry_time():
    encoder = zmqpush.JournalEncoder(b"t", 7, batch=False, timestamp=True)
    entry = b'{"MESSAGE":"m","__REALTIME_TIMESTAMP":"1000000","type":"x"}\n'
    (event,), _ = encoder.encode(entry, read_at=1e9)
    assert json.loads(event) == {"type": "t", "@pid": 7, "message": "m",
                                 "@timestamp": "1970-01-01T00:00:01.000000Z",
                                 "journald": {"type": "x"},
                                 "event": {"created": "2001-09-09T01:46:40.000Z"}}


def test_journal_encoder_loses_no_value_it_cannot_map():
    """A MESSAGE that is neither text nor bytes stays under "journald", said in
    "@json_error"; a field journald repeated keeps every value there too."""
    encoder = zmqpush.JournalEncoder(b"t", 7, batch=False)
    entry = b'{"MESSAGE":[300,-1],"_PID":["1","2"],"SYSLOG_IDENTIFIER":"app"}\n'
    (event,), _ = encoder.encode(entry)
    event = json.loads(event)
    assert "message" not in event and event["journald"]["MESSAGE"] == [300, -1]
    assert "MESSAGE is neither text nor bytes" in event["@json_error"]
    assert event["pid"] == 1 and event["journald"]["_PID"] == ["1", "2"]


# ---------------------------------------------------------- sink, pipeline --

class _Replies:
    """Replies as a list: True for "OK", False for a refusal."""

    def __init__(self):
        self.said = []

    async def reply(self, accepted: bool, lines: int = 1):
        self.said += [accepted] * lines


def _drain(queue) -> list:
    items = []
    while True:
        try:
            items.append(queue.get_nowait())
        except asyncio.QueueEmpty:
            return items


def test_memory_sink_offers_up_to_its_bound():
    async def go():
        queue = zmqpush.ByteQueue(1000)
        small = zmqpush.parcel_of([b"x" * 10], [1], [True])
        assert queue.offer(small) and queue.nbytes == small.nbytes
        big = zmqpush.parcel_of([b"x" * 1000], [1], [True])
        assert queue.offer(big)  # under the bound when offered: taken past it
        assert not queue.offer(small) and not queue.durable
        queue.take_past_cap()
        assert _drain(queue) == [small, big]
    asyncio.run(go())


def test_memory_sink_put_waits_for_room_and_get_for_an_item():
    """put() past the bound waits until the sender takes something; get()
    on an empty queue waits until something comes; END passes last."""
    async def go():
        queue = zmqpush.ByteQueue(100)
        first, second = (zmqpush.parcel_of([b"x" * 100], [1], [True]) for _ in range(2))
        await queue.put(first)
        assert queue.full()
        putting = asyncio.ensure_future(queue.put(second))
        await asyncio.sleep(0.01)
        assert not putting.done() and queue.nbytes == first.nbytes
        assert await queue.get() is first
        await asyncio.wait_for(putting, 5)
        assert queue.get_nowait() is second and queue.empty()
        getting = asyncio.ensure_future(queue.get())
        await asyncio.sleep(0.01)
        assert not getting.done()
        await queue.put(zmqpush.END)
        assert await asyncio.wait_for(getting, 5) is zmqpush.END
        with pytest.raises(asyncio.QueueEmpty):
            queue.get_nowait()
    asyncio.run(go())


def test_spool_sink_offers_to_the_spool(tmp_path):
    async def go():
        spool = zmqpush.Spool(str(tmp_path), 1 << 20, 0.0, zmqpush.Counters())
        queue = zmqpush.SpoolQueue(1 << 20, spool, zmqpush.Counters())
        parcel = zmqpush.parcel_of([b"m"], [1], [True])
        assert queue.durable and queue.offer(parcel) and spool.end > 0
        (taken,) = _drain(queue)
        assert taken.messages == [b"m"]
        spool.close(done=False)
    asyncio.run(go())


def _pipeline(config_args: list, replies=None, sink=None):
    config = zmqpush.parse_options(["--linger", "0", *config_args], environ={})
    sink = sink if sink is not None else zmqpush.ByteQueue(1 << 20)
    encoder = zmqpush.Encoder(b"t", 1, batch=False)
    return sink, zmqpush.build_pipeline(config, sink, encoder=encoder,
                                        counters=zmqpush.Counters(), replies=replies)


def messages_of(items: list) -> list:
    out = []
    for item in items:
        parcel = getattr(item, "parcel", item)
        if parcel is not None and parcel is not zmqpush.END:
            out += [json.loads(m)["message"] for m in parcel.messages]
    return out


def test_plain_pipeline_has_no_stage_and_queues_each_line():
    async def go():
        sink, pipeline = _pipeline([])
        assert type(pipeline) is zmqpush.Pipeline
        await pipeline.feed(b"a\nb\nc", 0.0)
        await pipeline.finish()
        items = _drain(sink)
        assert messages_of(items) == ["a", "b", "c"] and items[-1] is zmqpush.END
    asyncio.run(go())


def test_joining_pipeline_joins_across_reads_and_flushes_at_the_end():
    async def go():
        sink, pipeline = _pipeline(["--multiline", "python"])
        await pipeline.feed(chunk([b"x", *TRACE[:2]]), 0.0)
        assert pipeline.held_lines() == 0  # held, but not answered (no --confirm)
        await pipeline.feed(chunk(TRACE[2:]), 0.0)
        await pipeline.finish()
        assert messages_of(_drain(sink)) == ["x", "\n".join(t.decode() for t in TRACE)]
    asyncio.run(go())


LONG = [b"a", b" a2", b"y" * 20 + b"\r", b" y2\r", b"z"]  # max 16 bytes: "y"*20 in pieces
PATTERN = ["--multiline-pattern", r"^\s", "--multiline-match", "after", "--max-line-bytes", "16"]


def test_joining_passes_an_over_long_lines_pieces_and_its_last_as_they_are():
    """A piece of an over-long line ends the pending event; its last piece
    is a line of its own, never the start of an event (the pieces give the
    line back)."""
    async def go():
        sink, pipeline = _pipeline(PATTERN)
        await pipeline.feed(chunk(LONG), 0.0)
        await pipeline.finish()
        items = _drain(sink)
        return messages_of(items), [json.loads(m).get("@continues") for p in items[:-1]
                                    for m in p.messages]
    messages, continues = asyncio.run(go())
    assert messages == ["a\n a2", "y" * 16, "yyyy", " y2", "z"]
    assert continues == [None, True, None, None, None]


def test_ledger_without_durable_sink_answers_an_over_long_line_as_its_own():
    """--confirm --multiline without a spool: the pieces go to ZeroMQ as lines
    of their own (the last one's reply is the line's: the Confirmer's), the
    lines held are answered "OK" at once, a line at a time as rsyslog sends
    them or all in one read."""
    async def go(reads: list) -> list:
        sink, pipeline = _pipeline(["--confirm", *PATTERN], replies=_Replies())
        for data in reads:
            await pipeline.feed(data, 0.0)
        await pipeline.finish()
        out = []
        for item in _drain(sink)[:-1]:
            if type(item) is zmqpush.Answered:
                out.append(("answered", messages_of([item]), item.answers))
            else:
                out.append(("sent", messages_of([item]), item.ends_line))
        return out
    expected = [("answered", [], 1), ("answered", [], 1),  # a, a2 held
                ("answered", ["a\n a2"], 0), ("sent", ["y" * 16], [False]),
                ("sent", ["yyyy"], [True]), ("answered", [], 1),  # y2 held
                ("answered", [" y2"], 0), ("answered", [], 1),  # z held
                ("answered", ["z"], 0)]
    assert asyncio.run(go([chunk(LONG)])) == expected
    assert asyncio.run(go([line + b"\n" for line in LONG])) == expected


def test_ledger_answers_each_line_once_in_order():
    """--confirm --multiline with a durable sink: held lines "OK" at once,
    every line one reply, the event spooled once, with no reply due."""
    class Durable(zmqpush.ByteQueue):
        durable = True

    async def go():
        replies = _Replies()
        sink, pipeline = _pipeline(["--multiline", "python", "--confirm"], replies=replies,
                                   sink=Durable(1 << 20))
        await pipeline.start()
        for count, line in enumerate([b"x", *TRACE, b"1 y"], 2):
            await pipeline.feed(line + b"\n", 0.0)
            assert len(replies.said) == count  # answered before the next line comes
        await pipeline.finish()
        assert replies.said == [True] * 7  # the first "OK", then one a line
        items = _drain(sink)
        assert messages_of(items) == ["x", "\n".join(t.decode() for t in TRACE), "1 y"]
        assert not any(any(p.ends_line) for p in items[:-1])  # answered: none due
    asyncio.run(go())


def test_ledger_without_durable_sink_queues_answered_items():
    async def go():
        replies = _Replies()
        sink, pipeline = _pipeline(["--multiline", "python", "--confirm"], replies=replies)
        for line in TRACE[:2]:
            await pipeline.feed(line + b"\n", 0.0)
        assert pipeline.held_lines() == 2
        await pipeline.finish()
        items = _drain(sink)
        assert [(type(i).__name__, i.answers) for i in items[:-1]] == [
            ("Answered", 1), ("Answered", 1), ("Answered", 0)]
        assert messages_of(items) == ["\n".join(t.decode() for t in TRACE[:2])]
    asyncio.run(go())


def test_ledger_with_a_spool_keeps_held_lines_for_the_next_run(tmp_path):
    """A run killed while a trace's first lines are answered and held: the
    spool's file `held` has them, and the next run takes them back, answered
    already (no reply), so the rest of the trace joins them."""
    async def run_once(lines: list, finish: bool) -> tuple:
        counters = zmqpush.Counters()
        spool = zmqpush.Spool(str(tmp_path), 1 << 20, float("inf"), counters)
        queue = zmqpush.SpoolQueue(1 << 20, spool, counters)
        replies = _Replies()
        _, pipeline = _pipeline(["--multiline", "python", "--confirm"], replies=replies,
                                sink=queue)
        await pipeline.start()
        for line in lines:
            await pipeline.feed(line + b"\n", 0.0)
        if finish:
            await pipeline.finish()
        items = _drain(queue)
        pipeline.close()
        spool.close(done=False)
        return replies.said, messages_of(items), queue.held_found()

    said, messages, held = asyncio.run(run_once([b"before", *TRACE[:2]], finish=False))
    assert said == [True] * 4 and messages == ["before"] and held == [TRACE[:2]]
    said, messages, held = asyncio.run(run_once([*TRACE[2:], b"1 after"], finish=True))
    assert said == [True] * 4  # the first "OK", then the three new lines only
    assert [m for m in messages if m != "before"] == [  # "before": what run 1 spooled
        "\n".join(t.decode() for t in TRACE), "1 after"]
    assert held == [] and not (tmp_path / "held").exists()


def test_ledger_with_a_spool_writes_held_lines_once_a_read(tmp_path, monkeypatch):
    """A 500-line trace in one read, held whole at its end: the file `held`
    is written (and renamed) once, not once a line, and has every line
    before any is answered."""
    renames, rename = [], zmqpush.os.rename
    monkeypatch.setattr(zmqpush.os, "rename", lambda a, b: (renames.append(b), rename(a, b)))
    trace = [TRACE[0]] + [b'  File "a.py", line %d, in f' % n for n in range(499)]
    found_at_reply = []  # lines in `held` at each reply

    async def go():
        counters = zmqpush.Counters()
        spool = zmqpush.Spool(str(tmp_path), 1 << 20, float("inf"), counters)
        queue = zmqpush.SpoolQueue(1 << 20, spool, counters)

        class Replies(_Replies):
            async def reply(self, accepted: bool, lines: int = 1):
                found_at_reply.append(sum(map(len, spool.held_found())))
                await super().reply(accepted, lines)
        replies = Replies()
        _, pipeline = _pipeline(["--multiline", "python", "--confirm"], replies=replies,
                                sink=queue)
        await pipeline.start()
        await pipeline.feed(chunk(trace), 0.0)
        held = queue.held_found()
        pipeline.close()
        spool.close(done=False)
        return replies.said, held
    said, held = asyncio.run(go())
    assert said == [True] * 501 and held == [trace]
    assert found_at_reply[-1] == 500  # kept before answered
    assert [r for r in renames if r.endswith("held")] == [str(tmp_path / "held")]


def test_per_source_pipeline_parses_each_json_line_once(json_parses):
    """--json --multiline: the joiner's parse of a line is the encoder's too,
    over a read longer than a run the stage takes at once."""

    async def go():
        sink = zmqpush.ByteQueue(1 << 30)
        config = zmqpush.parse_options(["--json", "--multiline", "python"], environ={})
        encoder = zmqpush.JsonEncoder(b"t", 1, batch=False)
        pipeline = zmqpush.build_pipeline(config, sink, encoder=encoder,
                                          counters=zmqpush.Counters(), replies=None)
        lines = [json.dumps({"n": n, "message": f"{n} line"}).encode() for n in range(3000)]
        lines[10:10] = [json.dumps({"message": t.decode()}).encode() for t in TRACE]
        await pipeline.feed(chunk(lines), 0.0)
        await pipeline.finish()
        return lines, messages_of(_drain(sink))
    lines, messages = asyncio.run(go())
    assert len(b"".join(lines)) > zmqpush.JSON_RUN_BYTES
    assert messages[10] == "\n".join(t.decode() for t in TRACE)
    assert messages[:10] + messages[11:] == [f"{n} line" for n in range(3000)]
    # each line once, the joined event's first line too (see ObjectView)
    assert len(json_parses) == len(lines), [p for p, _ in json_parses if "Traceback" in p]


def test_an_event_the_quiet_timer_closes_is_parsed_once_a_line(json_parses):
    """--json --multiline: a trace held past its read and closed by the
    quiet timer keeps its first line's parse for the joined event."""
    trace = [json.dumps({"message": t.decode(), "n": n}).encode() for n, t in enumerate(TRACE)]

    async def go():
        sink = zmqpush.ByteQueue(1 << 30)
        config = zmqpush.parse_options(["--json", "--multiline", "python",
                                        "--multiline-timeout", "0.01"], environ={})
        pipeline = zmqpush.build_pipeline(config, sink,
                                          encoder=zmqpush.JsonEncoder(b"t", 1, batch=False),
                                          counters=zmqpush.Counters(), replies=None)
        await pipeline.feed(chunk(trace), 0.0)
        assert pipeline.held() == len(TRACE)
        for _ in range(200):
            if not pipeline.held():
                break
            await asyncio.sleep(0.01)
        events = [json.loads(m) for parcel in _drain(sink) for m in parcel.messages]
        pipeline.close()
        return events
    events = asyncio.run(go())
    assert [(e["message"], e["n"]) for e in events] == [
        ("\n".join(t.decode() for t in TRACE), 0)]
    assert len(json_parses) == len(TRACE), json_parses


def test_per_source_pipeline_parses_mixed_lines_once(json_parses):
    """--json --multiline on lines that are not all objects with a message
    (text, an object without one, leading space, invalid UTF-8): each JSON
    object is still parsed once, the joiner's parse being the encoder's."""
    trace = [json.dumps({"message": t.decode()}).encode() for t in TRACE]
    lines = [b'{"message":"a"}', b"plain text", b'{"n":1}', b' {"message":"spaced"}',
             *trace, b'{"message":"10:00 b"}', b"\xff", b'{"message":"10:00 c"}']

    async def go():
        sink = zmqpush.ByteQueue(1 << 30)
        config = zmqpush.parse_options(["--json", "--multiline", "python"], environ={})
        pipeline = zmqpush.build_pipeline(config, sink,
                                          encoder=zmqpush.JsonEncoder(b"t", 1, batch=False),
                                          counters=zmqpush.Counters(), replies=None)
        await pipeline.feed(chunk(lines), 0.0)
        await pipeline.finish()
        return [json.loads(m) for parcel in _drain(sink) if parcel is not zmqpush.END
                for m in parcel.messages]
    events = asyncio.run(go())
    assert [e.get("message", e.get("n")) for e in events] == [
        "a", "plain text", 1, "spaced", "\n".join(t.decode() for t in TRACE), "10:00 b",
        "\ufffd", "10:00 c"]
    objects = [text for text, at in json_parses if text[at:at + 1] == "{"]
    assert len(objects) == len(lines) - 2, objects  # every line but the two not JSON


def test_a_run_without_stages_ships_lines_a_ledger_left_held(tmp_path):
    """The spool's held lines, left by a --confirm --multiline run, leave as
    lines when the next run has no stage (never answered again)."""
    async def go():
        counters = zmqpush.Counters()
        spool = zmqpush.Spool(str(tmp_path), 1 << 20, float("inf"), counters)
        spool.keep_held([[TRACE[2]], TRACE[:2]])  # a joining stage's after a first's
        queue = zmqpush.SpoolQueue(1 << 20, spool, counters)
        replies = _Replies()
        _, pipeline = _pipeline(["--confirm"], replies=replies, sink=queue)
        await pipeline.start()
        items = _drain(queue)
        spool.close(done=False)
        return replies.said, items, queue.held_found()
    said, items, held = asyncio.run(go())
    assert said == [True] and held == []
    assert messages_of(items) == [t.decode() for t in TRACE[:3]]
    assert [p.ends_line for p in items] == [[False, False, False]]


def test_held_file_without_stage_counts_is_the_first_stages(tmp_path):
    """A `held` file as runs before the stages' counts wrote it (its lines
    only) reads as the first stage's lines; a torn one as none."""
    counts = zmqpush.SPOOL_COUNT
    body = counts.pack(2) + b"".join(counts.pack(len(t)) + t for t in TRACE[:2])

    async def found(data: bytes) -> list:
        (tmp_path / "held").write_bytes(data)
        spool = zmqpush.Spool(str(tmp_path), 1 << 20, float("inf"), zmqpush.Counters())
        try:
            return spool.held_found()
        finally:
            spool.close(done=False)
    assert asyncio.run(found(body)) == [TRACE[:2]]
    assert asyncio.run(found(body + counts.pack(1) + counts.pack(1))) == [TRACE[:1], TRACE[1:2]]
    assert asyncio.run(found(body + counts.pack(3))) == []


# ------------------------------------------------------------------ sockets --

def test_ready_messages_drains_a_socket_until_it_is_empty_or_closed():
    """The one loop that reads a ZeroMQ socket watched through its FD (ZAP
    requests, monitor events): every message ready, then nothing; nothing
    more once the socket is gone."""
    import zmq
    context = zmq.Context()
    pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
    try:
        pull.bind("inproc://ready")
        push.connect("inproc://ready")
        for n in range(3):
            push.send_multipart([b"head", b"%d" % n])
        assert list(zmqpush.ready_messages(lambda: pull, zmq)) == [
            [b"head", b"0"], [b"head", b"1"], [b"head", b"2"]]
        assert list(zmqpush.ready_messages(lambda: pull, zmq)) == []
        push.send(b"again")
        push.send(b"left")
        holder = [pull]
        taken = []
        for frames in zmqpush.ready_messages(lambda: holder[0], zmq):
            taken.append(frames)
            holder[0] = None  # closed while handling the first
        assert taken == [[b"again"]]
    finally:
        push.close(linger=0)
        pull.close(linger=0)
        context.term()


@pytest.mark.parametrize("free, trims", [(zmqpush.TRIM_FREE_BYTES - 1, 0),
                                         (zmqpush.TRIM_FREE_BYTES, 2)], ids=["little-free", "free"])
def test_heap_trimmer_trims_each_few_mib_read_only_a_heap_holding_enough_free(
        monkeypatch, free, trims):
    """The heap is trimmed once each `every` bytes read, and only while glibc's
    heap holds TRIM_FREE_BYTES free or more (less is faulted in again by the
    next reads: page faults for no lower peak)."""
    trimmed = []
    monkeypatch.setattr(zmqpush, "glibc_heap_calls", lambda: (trimmed.append, lambda: free))
    heap = zmqpush.HeapTrimmer(every=1000)
    for _ in range(25):
        heap.read(100)
    assert trimmed == [0] * trims


def test_glibc_heap_calls_see_holes_left_in_the_heap():
    """Blocks of 64 KiB (glibc's heap, below its mapping threshold) freed
    between kept ones: the free bytes grow by about what was freed."""
    trim, free_bytes = zmqpush.glibc_heap_calls()
    blocks, kept = [], []
    for _ in range(64):
        blocks.append(b"x" * (64 << 10))
        kept.append(b"k" * 1000)
    held = free_bytes()
    del blocks
    assert free_bytes() - held >= 3 << 20
    assert trim(0) in (0, 1)
