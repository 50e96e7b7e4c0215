#!/usr/bin/env python3
"""Print the watermarks zmqpush would run with, for the same options.

Opens the same PUSH stream as zmqpush.py (no receiver needed: connecting is
lazy) and prints the aiozmq transport's write-buffer limits in the original
tool's two lines, then ZeroMQ's SNDHWM and SNDBUF and the kernel's
net.ipv4.tcp_wmem.  --json prints the same as one JSON object.  Exit codes as
zmqpush's: 2 for a usage error, 1 when stdout cannot be written (silently
when its reader has gone).
"""
import json
import os
import sys

# setup.py installs this file with INSTALLED = True.  Installed, it sits in bin/ beside the
# zmqpush.py launcher, which must not shadow the zmqpush module; from a checkout, the module
# is the zmqpush.py beside it.
INSTALLED = False
if INSTALLED:
    _here = os.path.dirname(os.path.realpath(__file__))
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != _here]

import zmqpush  # noqa: E402

TCP_WMEM = "/proc/sys/net/ipv4/tcp_wmem"
DESCRIPTION = "Print the watermarks zmqpush would run with, for the same options."


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
    context = zmq.Context()
    try:
        stream = await zmqpush.open_stream(config, context)
    except OSError:
        context.term()
        raise
    sock = stream.transport.get_extra_info("zmq_socket")
    low, high = stream.transport.get_write_buffer_limits()
    values = {"low_watermark": low, "high_watermark": high,
              "sndhwm": sock.getsockopt(zmq.SNDHWM), "sndbuf": sock.getsockopt(zmq.SNDBUF),
              "tcp_wmem": kernel_tcp_wmem()}
    stream.close()
    sock.close(linger=0)
    context.term()
    return values


def report(values: dict, as_json: bool) -> str:
    """The text to print: the original's two lines and more, or one JSON object."""
    if as_json:
        return json.dumps(values) + "\n"
    sndbuf = values["sndbuf"]
    return "".join(line + "\n" for line in (
        f"Low watermark: {values['low_watermark']}",
        f"High watermark: {values['high_watermark']}",
        f"ZeroMQ SNDHWM: {values['sndhwm']} messages",
        f"ZeroMQ SNDBUF: {sndbuf}" + (" (kernel default)" if sndbuf < 0 else " bytes"),
        f"net.ipv4.tcp_wmem: {values['tcp_wmem']}"))


def main(argv=None) -> int:
    """The command line: returns the exit code."""
    closed = zmqpush.reopen_closed_std_fds()
    parser = zmqpush.build_parser("zmqpush-watermark.py", structured=False)
    parser.description = DESCRIPTION
    parser.epilog = None
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    try:
        args = parser.parse_args(argv)
        config = zmqpush.config_from_args(parser, args)
    except zmqpush.UsageError as exc:
        zmqpush.warn(f"{exc} (see {zmqpush.help_for(str(exc))})")
        return zmqpush.EXIT_USAGE
    if 1 in closed:
        zmqpush.warn("cannot write to stdout: it was closed at start")
        return zmqpush.EXIT_ERROR
    loop = zmqpush.new_event_loop()
    try:
        values = loop.run_until_complete(effective_watermarks(config))
    except OSError as exc:
        zmqpush.warn(f"cannot use endpoint: {exc.strerror or exc}")
        return zmqpush.endpoint_error_code(exc)
    finally:
        loop.close()
    return zmqpush.write_stdout(report(values, args.json))


if __name__ == "__main__":
    sys.exit(main())
