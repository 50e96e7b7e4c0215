"""The encoder and the line framer on arbitrary bytes (property tests)."""
import json
import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import zmqpush

lines_st = st.lists(st.binary(max_size=60).map(lambda b: b.replace(b"\n", b"")),
                    min_size=1, max_size=20)


def expected(line: bytes) -> str:
    if line.endswith(b"\r"):
        line = line[:-1]
    return line.decode("utf-8", "replace")


@settings(max_examples=400, deadline=None)
@given(lines_st, st.text(max_size=10))
def test_any_bytes_encode_to_strict_json_with_three_fields_in_order(lines, logtype):
    encoder = zmqpush.Encoder(logtype.encode(), 4242, batch=False)
    messages, events = encoder.encode(b"".join(line + b"\n" for line in lines))
    assert len(messages) == len(events) == len(lines) and set(events) <= {1}
    for message, line in zip(messages, lines):
        doc = json.loads(message.decode("utf-8"), strict=True)
        assert list(doc) == ["message", "type", "@pid"]
        assert doc == {"message": expected(line), "type": logtype, "@pid": 4242}


@settings(max_examples=200, deadline=None)
@given(lines_st)
def test_batch_mode_is_one_strict_json_array_of_the_same_events(lines):
    data = b"".join(line + b"\n" for line in lines)
    single, _ = zmqpush.Encoder(b"t", 1, batch=False).encode(data)
    (batch,), (count,) = zmqpush.Encoder(b"t", 1, batch=True).encode(data)
    assert json.loads(batch, strict=True) == [json.loads(m) for m in single]
    assert count == len(lines)


@settings(max_examples=300, deadline=None)
@given(lines_st, st.integers(60, 400), st.booleans())
def test_batch_arrays_are_capped_and_carry_every_event_once_in_order(lines, cap, ids):
    """No array exceeds the cap unless it holds one event; cuts never fall inside
    an event (hostile bytes included), with and without event ids."""
    data = b"".join(line + b"\n" for line in lines)
    run_id = "r1" if ids else None
    single, _ = zmqpush.Encoder(b"t%", 1, batch=False, run_id=run_id).encode(data)
    arrays, counts = zmqpush.Encoder(b"t%", 1, batch=True, run_id=run_id,
                                     array_bytes=cap).encode(data)
    docs = [json.loads(a, strict=True) for a in arrays]
    assert [len(d) for d in docs] == counts
    assert all(len(a) <= cap for a, d in zip(arrays, docs) if len(d) > 1)
    assert [e for d in docs for e in d] == [json.loads(m) for m in single]


def test_event_ids_run_on_across_chunks_and_follow_the_other_fields():
    encoder = zmqpush.Encoder(b"t", 7, batch=False, fields=((b"k", b"v"),), run_id="abc")
    first, _ = encoder.encode(b"a\nb\n")
    second, _ = encoder.encode(b"c\n", continues=True)
    docs = [json.loads(m) for m in first + second]
    assert [d["@metadata"] for d in docs] == [{"_id": f"abc-{i}"} for i in range(3)]
    assert list(docs[2]) == ["message", "type", "@pid", "k", "@continues", "@metadata"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(4, 40))
def test_framer_loses_no_byte_and_never_exceeds_the_limit(chunks, limit):
    """Whatever the reads, pieces rejoin into the input's lines, each at most limit
    bytes once repaired as the encoder repairs it (invalid UTF-8 becomes U+FFFD)."""
    framer = zmqpush.LineFramer(limit)
    segments = [s for chunk in chunks for s in framer.feed(chunk)] + framer.finish()
    rebuilt, current = [], b""
    for seg in segments:
        body = zmqpush.valid_utf8(seg.lines[:-1])
        if seg.continues:
            assert len(body) <= limit
            current += body
            continue
        parts = body.split(b"\n")
        assert all(len(p) <= limit + 1 for p in parts)  # +1: a CR before the newline
        parts[0] = current + parts[0]
        current = b""
        rebuilt.extend(parts)
    data = b"".join(chunks)
    lines = data.split(b"\n")
    if lines[-1] == b"":
        lines.pop()
    assert rebuilt == [zmqpush.valid_utf8(line) for line in lines]


def test_overlong_lines_are_cut_at_character_boundaries():
    framer = zmqpush.LineFramer(10)
    line = "é€😀".encode() * 5
    segments = framer.feed(line + b"\n")
    assert all(s.lines[:-1].decode("utf-8") for s in segments)  # each piece decodes alone
    assert b"".join(s.lines[:-1] for s in segments) == line
    assert [s.continues for s in segments][-1] is False
    assert all(s.continues for s in segments[:-1])


def test_continuation_pieces_are_marked_in_json():
    encoder = zmqpush.Encoder(b"t", 1, batch=False)
    (msg,), _ = encoder.encode(b"abc\r\n", strip_cr=False, continues=True)
    assert json.loads(msg) == {"message": "abc\r", "type": "t", "@pid": 1, "@continues": True}


# UTF-8 fragments of every width, whole and cut short, stray bytes, and newlines.
utf8_parts = st.sampled_from([b"a", b"\n", b"\xc3\xa9", b"\xe6\x97\xa5", b"\xf0\x9f\x98\x80",
                              b"\xc3", b"\xe6\x97", b"\xf0\x9f\x98", b"\x80", b"\xbf",
                              b"\xff", b"\xed\xa0\x80", b"\xc0\xaf", b"\xf4\x90\x80\x80"])


@settings(max_examples=500, deadline=None)
@given(st.lists(utf8_parts, max_size=40).map(b"".join) | st.binary(max_size=80))
def test_utf8_repair_equals_a_decode_with_replacement(data):
    assert zmqpush.valid_utf8(data) == data.decode("utf-8", "replace").encode()
