#!/usr/bin/env python3
"""Check that bench/cship.c sends byte for byte what zmqpush sends by default.

Not a benchmark: a correctness check of the C reference the benchmarks compare
against.  Inputs: the corpus (bench/corpus.py), every UTF-8 lead byte followed by
edge-case bytes (overlong forms, surrogates, truncated and interrupted sequences),
controls, quotes, backslashes, CR before and away from LF, and random bytes.
Expected messages come from Python itself: the line decoded with
errors="replace", escaped by json.encoder.c_encode_basestring.  Compared with
cship (one message per line, and --array: the same events in arrays) and with
zmqpush, with "@pid" set to 0 on all sides.  Prints one line per comparison.
"""
import argparse
import itertools
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import zmq

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from corpus import write_corpus  # noqa: E402
from cref import build  # noqa: E402

PID = re.compile(rb',"@pid":\d+}')
EDGES = [0x00, 0x09, 0x0A, 0x0D, 0x22, 0x41, 0x5C, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0,
         0xBF, 0xC0, 0xC2, 0xE0, 0xED, 0xF0, 0xF4, 0xFF]


def tricky_input(seed: int = 7) -> bytes:
    """Lines that probe UTF-8 repair and escaping, then random bytes."""
    lines = []
    for lead in range(0x80, 0x100):
        for rest in itertools.product(EDGES, repeat=2):
            lines.append(b"a" + bytes((lead, *rest)) + b"\x80\xbfz")
            lines.append(bytes((lead, rest[0])))
        lines.append(bytes((lead,)))
    for valid in ("é", "€", "😀", "\U0010ffff", "\ud7ff", "\ue000"):
        text = valid.encode()
        lines += [text, text + text[:-1], text[:-1] + text, text * 3]
    lines += [bytes(range(0x20)) + b'"\\\x7f', b"cr\r", b"\r", b"\r\r", b"mid\rdle", b""]
    rnd = random.Random(seed)
    alphabet = bytes([*range(0x20), 0x22, 0x5C, 0x41, 0x7F, *range(0x80, 0x100)])
    for _ in range(20000):
        lines.append(bytes(rnd.choice(alphabet) for _ in range(rnd.randint(0, 12))))
    body = b"".join(line + (b"\r\n" if i % 3 == 0 else b"\n") for i, line in enumerate(lines))
    return body + b"last line without newline \xe2\x82\r"


def expected(data: bytes, logtype: str = "syslog") -> list:
    """zmqpush's default messages for data, with "@pid" 0."""
    escape = json.encoder.c_encode_basestring
    pieces = data.split(b"\n")
    lines = [p[:-1] if p.endswith(b"\r") else p for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    tail = b',"type":' + escape(logtype).encode() + b',"@pid":0}'
    return [b'{"message":' + escape(line.decode("utf-8", "replace")).encode() + tail
            for line in lines]


def shipped(command: list, data: bytes, count: int) -> list:
    """Frames a shipper sends for data, "@pid" set to 0."""
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.bind("tcp://127.0.0.1:*")
    endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
    with tempfile.TemporaryFile() as f:
        f.write(data)
        f.seek(0)
        proc = subprocess.Popen([*command[:1], *[a.replace("ENDPOINT", endpoint)
                                                 for a in command[1:]]], stdin=f)
        frames, events = [], 0
        deadline = time.monotonic() + 60
        while events < count and time.monotonic() < deadline:
            if sock.poll(5000):
                frame = sock.recv()
                frames.append(PID.sub(b',"@pid":0}', frame))
                events += frame.count(b'{"message":"')
            elif proc.poll() is not None:
                break
        proc.wait(30)
    sock.close()
    return frames


def compare(name: str, got: list, want: list, array: bool = False) -> bool:
    events = len(want)
    if array:
        got = [b",".join(frame[1:-1] for frame in got)]
        want = [b",".join(want)]
    same = got == want
    detail = ""
    if not same:
        for i, (g, w) in enumerate(zip(got, want)):
            if g != w:
                detail = f": first difference at message {i}: {g!r} != {w!r}"
                break
        else:
            detail = f": {len(got)} messages, {len(want)} expected"
    print(f"{'same' if same else 'DIFFERENT'}: {name}, {events} events{detail}")
    return same


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--zmqpush", default=str(HERE.parent / "zmqpush.py"))
    p.add_argument("--python", default=sys.executable)
    p.add_argument("--lines", type=int, default=100_000, help="corpus lines")
    args = p.parse_args()
    cship = build("cship")
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.log")
        write_corpus(corpus, args.lines)
        inputs = {"corpus": Path(corpus).read_bytes(), "tricky bytes": tricky_input()}
    ok = True
    for what, data in inputs.items():
        want = expected(data)
        ok &= compare(f"cship, {what}", shipped([cship, "ENDPOINT"], data, len(want)), want)
        ok &= compare(f"cship --array, {what}",
                      shipped([cship, "ENDPOINT", "--array"], data, len(want)), want, True)
        ok &= compare(f"zmqpush, {what}",
                      shipped([args.python, args.zmqpush, "-q", "-c", "ENDPOINT"], data,
                              len(want)), want)
    want = expected(b"x\n", "t\"y\tp\xe9")
    ok &= compare("cship, LOGTYPE escaped",
                  shipped([cship, "ENDPOINT", "t\"y\tp\xe9"], b"x\n", 1), want)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
