#!/usr/bin/env python3
"""A receiver whose socket is set up like logstash-input-zeromq's, consuming slowly.

The plugin (read from its source) binds a PULL socket with LINGER 1 ms, RCVTIMEO
1000 ms and libzmq's default RCVHWM (1000 messages), takes whole multipart
messages and decodes every frame on its own; a JSON array is one event per
element.  This stand-in does the same, consumes at most --rate events/s (a busy
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


def event_lines(frame: bytes, ids: bool) -> list:
    """One output line per event of a frame (arrays are one event per element)."""
    doc = json.loads(frame, strict=True)
    events = doc if isinstance(doc, list) else [doc]
    if ids:
        return [json.dumps([e.get("@metadata", {}).get("_id"), e["message"]]) for e in events]
    return [e["message"] for e in events]


# Debian's net.ipv4.tcp_rmem maximum is 6 MiB, the receive buffer zmqpush's replay
# window is sized to cover; SO_RCVBUF is doubled by the kernel.  A machine tuned
# higher (this project's CI machines: 32 MiB) would let a receiver hold more.
DEFAULT_LINUX_RCVBUF = 3 << 20


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
        sock.bind(args.bind)
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(1))
    out = os.open(args.out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    received, pace = 0, time.monotonic()
    while not stopping:
        try:
            frames = sock.recv_multipart()
        except zmq.Again:
            continue
        except zmq.ZMQError:  # EINTR at SIGTERM
            continue
        lines = [line for frame in frames for line in event_lines(frame, args.ids)]
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
