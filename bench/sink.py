#!/usr/bin/env python3
"""A ZeroMQ PULL receiver that stands in for Logstash's zeromq input.

Binds (or connects) a PULL socket, decodes every frame as JSON the way the
Logstash json codec does (an array is one event per element), prints each
event's "message" (with --raw every frame as it came: whole events, a --batch
array as one line; nothing with --quiet), and at the end prints one line:
"received N events (M invalid) in S s".  Ends after --count events, after
--idle seconds without any, or on SIGINT/SIGTERM (within POLL_MS, traffic or not).
With --hold, --count events do not end it: it stays connected, counting any event
more, until a signal came and it has --count events, or --idle passes (a sender
that sees its receiver leave as its input ends keeps the last lines to send again).
"""
import argparse
import json
import signal
import sys
import time

import zmq
import zmq.auth

DEFAULT_BIND = "tcp://127.0.0.1:2120"  # zmqpush's default endpoint
POLL_MS = 200  # how often the loop looks at signals and --idle when nothing comes


def events_of(frame: bytes):
    """The events a frame carries, or None if it is not strict JSON."""
    try:
        doc = json.loads(frame, strict=True)
    except ValueError:
        return None
    return doc if isinstance(doc, list) else [doc]


def events_of_frames(frames: list):
    """(events, invalid frames) of many frames, parsed in one strict call when all
    are valid: joined as one array, which must have one element per frame."""
    try:
        docs = json.loads(b"[" + b",".join(frames) + b"]", strict=True)
    except ValueError:
        docs = None
    if docs is None or len(docs) != len(frames):
        parsed = [events_of(frame) for frame in frames]
        return [e for p in parsed if p is not None for e in p], parsed.count(None)
    events = []
    for doc in docs:
        if isinstance(doc, list):
            events += doc
        else:
            events.append(doc)
    return events, 0


def drain(sock, most: int = 10_000, most_bytes: int = 4 << 20):
    """Frames that are ready now, without waiting: at most `most` of them and
    about `most_bytes` (one parse of a huge join would cost more than many).

    Every frame is its own event source, as in Logstash's zeromq input, so
    frames are taken one by one (recv_multipart costs five times as much)."""
    frames = []
    append, recv, size = frames.append, sock.recv, 0
    try:
        while len(frames) < most and size < most_bytes:
            frame = recv(zmq.NOBLOCK)
            append(frame)
            size += len(frame)
    except zmq.Again:
        pass
    return frames


def done(args, received: int, stopping: list) -> bool:
    """Whether the receiving loop ends now (see the module docstring)."""
    counted = bool(args.count) and received >= args.count
    if args.hold and args.count:
        return counted and bool(stopping)
    return counted or bool(stopping)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bind", default=DEFAULT_BIND,
                   help=f"endpoint to bind (default {DEFAULT_BIND}, zmqpush's default)")
    p.add_argument("--connect", help="connect to this endpoint instead of binding")
    p.add_argument("--count", type=int, default=0, help="stop after N events")
    p.add_argument("--idle", type=float, default=0, help="stop after S seconds with none")
    p.add_argument("--hold", action="store_true",
                   help="with --count: stay connected after N events until SIGTERM/SIGINT "
                   "(or --idle), counting any event more; a signal before N waits for N")
    p.add_argument("--quiet", action="store_true", help="print only the summary")
    p.add_argument("--raw", action="store_true",
                   help="print every frame as it came (whole events), not the messages")
    p.add_argument("--curve-server", metavar="SECRET_CERT",
                   help="be a CURVE server with this key pair (admits any client key)")
    args = p.parse_args()

    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    signal.signal(signal.SIGINT, lambda *_: stopping.append(1))
    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVHWM, 0)  # queue without bound: parsing never slows the sender
    if args.curve_server:
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(args.curve_server)
    if args.connect:
        sock.connect(args.connect)
    else:
        sock.bind(args.bind)
    received = invalid = 0
    started = last = None
    out = sys.stdout
    while not done(args, received, stopping):
        if not sock.poll(POLL_MS):
            if args.idle and last is not None and time.monotonic() - last >= args.idle:
                break
            continue
        last = time.monotonic()
        started = started or last
        frames = drain(sock)
        events, bad = events_of_frames(frames)
        received += len(events)
        invalid += bad
        if args.raw and not args.quiet:
            out.flush()
            out.buffer.write(b"".join(frame + b"\n" for frame in frames))
        elif not args.quiet:
            for event in events:
                out.write(json.dumps(event.get("message"), ensure_ascii=False) + "\n")
    took = time.monotonic() - started if started else 0.0
    print(f"received {received} events ({invalid} invalid) in {took:.3f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
