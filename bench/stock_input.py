#!/usr/bin/env python3
"""A receiver whose socket is set up like logstash-input-zeromq's, consuming slowly.

The plugin (read from its source) binds a PULL socket with LINGER 1 ms, RCVTIMEO
1000 ms and libzmq's default RCVHWM (1000 messages), takes whole multipart
messages and decodes every frame on its own; a JSON array is one event per
element.  This stand-in does the same for zmqpush's messages (one frame each:
it takes the frames ready at once together), consumes at most --rate events/s (a busy
Logstash), and appends one line per event to --out with an unbuffered write as
soon as the event is taken, so what it wrote survives SIGKILL: the line is the
event's "message", or with --ids its [@metadata][_id] and message as JSON.
SIGTERM closes the socket with LINGER 1 (discarding what it still holds, as a
Logstash restart does) and exits 0; at the end it prints "received N events".
"""
import argparse
import json
import os
import signal
import sys
import time

import zmq
from ports import bind_when_free


def parsed_together(docs: list) -> list:
    """docs (JSON documents, all bytes or all str) parsed strictly in one json.loads
    call, which is much cheaper than one call each; [] if that call fails or yields
    another count (then the caller parses each on its own)."""
    if docs and isinstance(docs[0], bytes):
        joined = b"[" + b",".join(docs) + b"]"
    else:
        joined = "[" + ",".join(docs) + "]"
    try:
        parsed = json.loads(joined, strict=True)
    except ValueError:
        return []
    return parsed if len(parsed) == len(docs) else []


def event_lines(frames: list, ids: bool) -> list:
    """One output line per event of the frames (arrays are one event per element).
    Each frame is one JSON document (strict), parsed together; failing that, each
    frame on its own (a BOM or UTF-16 frame decodes; a bad frame raises)."""
    docs = parsed_together(frames) or [json.loads(frame, strict=True) for frame in frames]
    events = [e for doc in docs for e in (doc if isinstance(doc, list) else [doc])]
    if ids:
        return [json.dumps([e.get("@metadata", {}).get("_id"), e["message"]]) for e in events]
    return [e["message"] for e in events]


def take(sock, at_once: int) -> list:
    """The next frame (waiting up to RCVTIMEO: zmq.Again if none came) and those
    ready after it without waiting, up to at_once frames or TAKE_BYTES.
    zmqpush sends one frame a message, so frames are taken one by one."""
    frames = [sock.recv()]
    size = len(frames[0])
    try:
        while len(frames) < at_once and size < TAKE_BYTES:
            frames.append(sock.recv(zmq.NOBLOCK))
            size += len(frames[-1])
    except zmq.ZMQError:  # none ready (zmq.Again), or EINTR at SIGTERM: keep what came
        pass
    return frames


# Debian's net.ipv4.tcp_rmem maximum is 6 MiB, the receive buffer zmqpush's replay
# window is sized to cover; SO_RCVBUF is doubled by the kernel.  A machine tuned
# higher (this project's CI machines: 32 MiB) would let a receiver hold more.
DEFAULT_LINUX_RCVBUF = 3 << 20
# Frames ready at once are taken, written and paced together, up to 128 (2 ms
# at 60,000 events/s) or 64 KiB (a --batch array: one at a time, as before): a
# syscall or two per frame was most of the CPU.  A slower --rate takes no more
# than 20 ms of its events at once (one frame below 100/s): a group is paced as
# one sleep, which SIGTERM does not cut short (128 at --rate 10: 12.8 s).
TAKE_AT_ONCE, TAKE_BYTES = 128, 64 << 10


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bind", help="endpoint to bind (the plugin's mode => server)")
    p.add_argument("--connect", help="endpoint to connect to (mode => client)")
    p.add_argument("--rate", type=float, default=60_000, help="events per second at most")
    p.add_argument("--out", required=True, help="file to append one line per event to")
    p.add_argument("--ids", action="store_true", help="write [id, message] per event")
    p.add_argument("--rcvbuf", type=int, default=0,
                   help="the TCP receive buffer (SO_RCVBUF, which Linux doubles; default "
                   f"0: the kernel's autotuning); {DEFAULT_LINUX_RCVBUF} holds what a "
                   "default Linux receiver's buffer grows to (tcp_rmem maximum 6 MiB), "
                   "whatever this machine's maximum")
    args = p.parse_args()

    sock = zmq.Context.instance().socket(zmq.PULL)
    sock.setsockopt(zmq.LINGER, 1)
    sock.setsockopt(zmq.RCVTIMEO, 1000)
    if args.rcvbuf:
        sock.setsockopt(zmq.RCVBUF, args.rcvbuf)
    if args.connect:
        sock.connect(args.connect)
    else:
        bind_when_free(sock, args.bind)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    received, pace = 0, time.monotonic()
    at_once = max(1, min(TAKE_AT_ONCE, int(args.rate / 50)))
    while not stopping:
        try:
            frames = take(sock, at_once)
        except zmq.Again:
            continue
        except zmq.ZMQError:  # EINTR at SIGTERM
            continue
        lines = event_lines(frames, args.ids)
        os.write(out, "".join(line + "\n" for line in lines).encode("utf-8", "surrogatepass"))
        received += len(lines)
        pace = max(pace, time.monotonic() - 0.05) + len(lines) / args.rate
        delay = pace - time.monotonic()
        if delay > 0:
            time.sleep(delay)
    sock.close()
    print(f"received {received} events", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
