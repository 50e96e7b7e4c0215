#!/usr/bin/env python3
"""What the design costs on its own: zmqpush's shape with none of its work.

    skeleton.py [--bare] ENDPOINT

The design shape (default): uvloop; stdin non-blocking in an edge-triggered
epoll whose descriptor the loop watches; a reader coroutine that reads until
EAGAIN and puts each read's messages on an asyncio.Queue; a sender coroutine
that takes them and sends each with DONTWAIT.  Messages are the head, the line
and the tail, concatenated: no escaping, no UTF-8 check, no flow control, no
replay, no counters.  A refused message is lost: this is a yardstick for
bench/paced.py, never a shipper.

--bare: the cheapest asyncio program that does the job: the loop watches stdin
itself (no inner epoll) and the reader coroutine sends (no queue, no sender).
"""
import asyncio
import os
import select
import sys

import uvloop
import zmq

HEAD = b'{"message":"'
TAIL = b'","type":"syslog","@pid":%d}' % os.getpid()


async def ship(endpoint: str, bare: bool):
    loop = asyncio.get_running_loop()
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    sock.connect(endpoint)
    send, dontwait = sock.send, zmq.DONTWAIT
    os.set_blocking(0, False)
    waiter = None

    def wake():
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    if bare:
        loop.add_reader(0, wake)
    else:
        epoll = select.epoll()
        epoll.register(0, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET)

        def on_epoll():
            epoll.poll(0)
            wake()
        loop.add_reader(epoll.fileno(), on_epoll)
    queue: asyncio.Queue = asyncio.Queue()

    async def reader():
        nonlocal waiter
        while True:
            try:
                data = os.read(0, 65536)
            except BlockingIOError:
                waiter = loop.create_future()
                await waiter
                waiter = None
                continue
            if not data:
                queue.put_nowait(None)
                return
            messages = [HEAD + line + TAIL for line in data.split(b"\n")[:-1]]
            if bare:
                for message in messages:
                    send(message, dontwait)
            else:
                queue.put_nowait(messages)

    async def sender():
        while True:
            messages = await queue.get()
            if messages is None:
                return
            for message in messages:
                send(message, dontwait)

    if bare:
        await reader()
    else:
        await asyncio.gather(reader(), sender())
    sock.close(linger=4000)
    context.term()


def main() -> int:
    uvloop.run(ship(sys.argv[-1], bare=sys.argv[1:2] == ["--bare"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
