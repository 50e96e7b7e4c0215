#!/usr/bin/env python3
"""Python floor: how fast CPython can hand pre-built messages to libzmq.

    floor.py ENDPOINT [LOGTYPE] < corpus

Reads all of stdin and builds every line's message exactly as zmqpush does by
default (untimed), then times only the send loop: one call per message of the
Cython backend's zmq.backend.Socket.send(sock, msg, zmq.DONTWAIT), skipping the
Python-level wrapper of zmq.Socket.send; on zmq.Again it polls for POLLOUT and
retries.  Reading, framing and JSON encoding are excluded, so this is a floor on
the per-message cost of any Python shipper sending one message per line, not a
shipper.  Prints "sent N messages in S s" on stdout, then closes with LINGER -1
(waits for delivery).
"""
import json
import os
import sys
import time

import zmq
from zmq.backend import Socket as BackendSocket


def messages(data: bytes, logtype: str) -> list:
    """zmqpush's default messages for data (see bench/cship_check.py)."""
    escape = json.encoder.c_encode_basestring
    pieces = data.split(b"\n")
    lines = [p[:-1] if p.endswith(b"\r") else p for p in pieces[:-1]]
    if pieces[-1]:
        lines.append(pieces[-1])
    tail = (b',"type":' + escape(logtype).encode() + b',"@pid":%d}' % os.getpid())
    return [b'{"message":' + escape(line.decode("utf-8", "replace")).encode() + tail
            for line in lines]


def main() -> int:
    if len(sys.argv) not in (2, 3):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    logtype = sys.argv[2] if len(sys.argv) > 2 else "syslog"
    built = messages(sys.stdin.buffer.read(), logtype)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, -1)
    sock.connect(sys.argv[1])
    send, again, dontwait, pollout = BackendSocket.send, zmq.Again, zmq.DONTWAIT, zmq.POLLOUT
    began = time.perf_counter()
    for msg in built:
        while True:
            try:
                send(sock, msg, dontwait)
                break
            except again:
                sock.poll(1000, pollout)
    took = time.perf_counter() - began
    print(f"sent {len(built)} messages in {took:.3f} s", flush=True)
    sock.close()
    ctx.term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
