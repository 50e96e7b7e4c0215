#!/usr/bin/env python3
"""The reference a user would write by hand: a synchronous pyzmq loop with json.dumps.

    for line in stdin: sock.send(json.dumps({...}))

Bytes are decoded with errors="replace" (a strict decode would crash on the
corpus's invalid UTF-8).  Usage: naive.py ENDPOINT [LOGTYPE]
"""
import json
import os
import sys

import zmq


def main() -> int:
    endpoint = sys.argv[1]
    logtype = sys.argv[2] if len(sys.argv) > 2 else "syslog"
    pid = os.getpid()
    sock = zmq.Context.instance().socket(zmq.PUSH)
    sock.connect(endpoint)
    for raw in sys.stdin.buffer:
        line = raw.rstrip(b"\n").decode("utf-8", "replace")
        sock.send(json.dumps({"message": line, "type": logtype, "@pid": pid}).encode())
    sock.close()
    zmq.Context.instance().term()
    return 0


if __name__ == "__main__":
    sys.exit(main())
