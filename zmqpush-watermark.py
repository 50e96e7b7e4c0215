#!/usr/bin/env python3
"""Print the watermarks zmqpush would run with, for the same options.

Opens the same PUSH stream as zmqpush.py (no receiver needed: connecting is
lazy) and prints the aiozmq transport's write-buffer limits in the original
tool's two lines, then ZeroMQ's SNDHWM and SNDBUF and the kernel's
net.ipv4.tcp_wmem.  --json prints the same as one JSON object.
"""
import json
import sys

import zmqpush

TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"


def kernel_tcp_wmem() -> str:
    """net.ipv4.tcp_wmem as "min default max", or "unknown"."""
    try:
        with open(TCP_WMEM) as f:
            return " ".join(f.read().split())
    except OSError:
        return "unknown"


async def effective_watermarks(config: zmqpush.Config) -> dict:
    """The values of a stream opened as zmqpush opens it."""
    import zmq
    stream, context = await zmqpush.open_stream(config)
    sock = stream.transport.get_extra_info("zmq_socket")
    low, high = stream.transport.get_write_buffer_limits()
    values = {"low_watermark": low, "high_watermark": high,
              "sndhwm": sock.getsockopt(zmq.SNDHWM), "sndbuf": sock.getsockopt(zmq.SNDBUF),
              "tcp_wmem": kernel_tcp_wmem()}
    stream.close()
    sock.close(linger=0)
    context.term()
    return values


def main(argv=None) -> int:
    parser = zmqpush.build_parser("zmqpush-watermark.py")
    parser.description = __doc__.split("\n\n")[0]
    parser.epilog = None
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    try:
        args = parser.parse_args(argv)
        config = zmqpush.config_from_args(parser, args)
    except zmqpush.UsageError as exc:
        zmqpush.warn(f"{exc} (see --help)")
        return zmqpush.EXIT_USAGE
    loop = zmqpush.new_event_loop()
    try:
        values = loop.run_until_complete(effective_watermarks(config))
    except OSError as exc:
        zmqpush.warn(f"cannot use endpoint: {exc.strerror or exc}")
        return zmqpush.EXIT_ERROR
    finally:
        loop.close()
    if args.json:
        print(json.dumps(values))
        return zmqpush.EXIT_OK
    sndbuf = values["sndbuf"]
    print(f"Low watermark: {values['low_watermark']}")
    print(f"High watermark: {values['high_watermark']}")
    print(f"ZeroMQ SNDHWM: {values['sndhwm']} messages")
    print(f"ZeroMQ SNDBUF: {sndbuf}" + (" (kernel default)" if sndbuf < 0 else " bytes"))
    print(f"net.ipv4.tcp_wmem: {values['tcp_wmem']}")
    return zmqpush.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
