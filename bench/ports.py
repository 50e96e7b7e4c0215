"""Ports on 127.0.0.1 for receivers, the tests' and the benchmarks' alike.

A port found free and then let go can be handed by the kernel to anyone's next
bind(0) while its receiver is down (before it starts, between a kill and its
restart): a test on the same machine then binds it, and the zmqpush meant for
the down receiver delivers to that test's receiver instead.  So free_port()
keeps each port it hands out bound, never listening, until release_ports():
connections to it are still refused while no receiver is up, a receiver can
still bind it (ZeroMQ, rsyslog's imczmq and zmqpush's --metrics-listen set
SO_REUSEADDR, as this reservation does), and no bind(0) or outgoing connection
on the machine gets it meanwhile.
"""
import socket
import time

import zmq

_reserved: list = []


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on, reserved (see above)
    until release_ports() or the end of this process."""
    holder = socket.socket()
    holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    holder.bind(("127.0.0.1", 0))
    _reserved.append(holder)
    return holder.getsockname()[1]


def reservations() -> int:
    """How many ports are reserved now: a mark for release_ports()."""
    return len(_reserved)


def release_ports(mark: int = 0) -> None:
    """Let go of the ports reserved since reservations() returned mark."""
    while len(_reserved) > mark:
        _reserved.pop().close()


def bind_when_free(sock, endpoint: str):
    """Bind sock, retrying for up to 10 s while the port is in use: a receiver
    stopped or killed on it just before may not have closed its socket yet on
    a loaded machine (a restart failed so)."""
    deadline = time.monotonic() + 10
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EADDRINUSE or time.monotonic() > deadline:
                raise
        time.sleep(0.05)
