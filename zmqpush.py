#!/usr/bin/env python3
"""zmqpush: read log lines on stdin, push them as JSON over a ZeroMQ PUSH socket.

Every line becomes {"message":LINE,"type":LOGTYPE,"@pid":PID}, the wire format
the Logstash zeromq input (codec json) turns into one event.  Data flows
options -> encoding -> reading -> sending -> lifecycle, and so does this file.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import errno
import json
import json.encoder
import os
import re
import select
import signal
import socket
import sys
import time
from typing import NamedTuple

__version__ = "1.0.0"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNDELIVERED = 3
EXIT_SIGNAL_BASE = 128

DEFAULT_ENDPOINT = "tcp://127.0.0.1:2120"
DEFAULT_LINGER = 4.0
DEFAULT_SNDHWM = 1000
# In --batch mode a message is a whole read: SNDHWM defaults to this many bytes of them.
BATCH_ZMQ_BYTES = 16 << 20
DEFAULT_QUEUE_BYTES = 4 << 20
DEFAULT_MAX_LINE_BYTES = 1 << 20
DEFAULT_READ_BYTES = 256 << 10
DEFAULT_CONFIRM_TIMEOUT = 2.0
# aiozmq transport (high, low): the sender spills into it until it passes low, so
# 0 spills only the message ZeroMQ refused (see Sender).
DEFAULT_WRITE_LIMITS = (64 << 10, 0)
RECONNECT_IVL_MS = 100
RECONNECT_IVL_MAX_MS = 1000

# ---------------------------------------------------------------- options --
# Owns the command line, its ZMQPUSH_* environment twins and their validation.

ENDPOINT_RE = re.compile(r"^(tcp://(\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):(\d{1,5}|\*)"
                         r"|ipc://\S+|inproc://\S+)$")

HELP_EPILOG = """\
examples:
  tail -F /var/log/app.log | zmqpush.py app
  seq 1 100 | zmqpush.py -c tcp://logstash.example:2120 --batch test

rsyslog (RainerScript):
  module(load="omprog")
  action(type="omprog" binary="/usr/local/bin/zmqpush.py syslog -c tcp://127.0.0.1:2120"
         template="RSYSLOG_SyslogProtocol23Format")
rsyslog (legacy, no arguments: set ZMQPUSH_CONNECT in rsyslog's environment):
  $ModLoad omprog
  $ActionOMProgBinary /usr/local/bin/zmqpush.py
  *.* :omprog:;RSYSLOG_SyslogProtocol23Format

Every option can also be set by an environment variable ZMQPUSH_<OPTION>
(e.g. ZMQPUSH_CONNECT, ZMQPUSH_LINGER, ZMQPUSH_WHEN_FULL); the command line wins.

exit codes:
  0    every line read was handed to ZeroMQ and delivered within --linger
  1    runtime error (e.g. the bind address is in use)
  2    usage error: bad option, value or endpoint
  3    undelivered: at exit some lines were not handed to ZeroMQ, or ZeroMQ
       still held messages when --linger ran out
  128+N  forced exit by a second SIGINT or SIGTERM (130, 143)
"""


class UsageError(Exception):
    """A bad option, value or endpoint: reported in one line, exit 2."""


class Config(NamedTuple):
    """Everything the run needs, validated."""

    logtype: str
    connect: list
    bind: list
    linger: float
    sndhwm: int
    write_high: int
    write_low: int | None
    queue_bytes: int
    max_line_bytes: int
    batch: bool
    batch_bytes: int
    when_full: str
    heartbeat: float | None
    confirm: bool
    confirm_timeout: float
    quiet: bool
    fields: tuple
    timestamp: bool
    stats: float | None
    stats_format: str
    progress: bool


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise UsageError(message)


class _HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Wraps at the terminal's width found with os alone: argparse's own lookup
    imports shutil (with zlib, bz2 and lzma), 3 ms of every start."""

    def __init__(self, prog: str):
        super().__init__(prog, width=_terminal_columns() - 2)


def _terminal_columns() -> int:
    """$COLUMNS, else stdout's terminal width, else 80 (as shutil would say)."""
    try:
        columns = int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        columns = 0
    if columns > 0:
        return columns
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
    except (AttributeError, ValueError, OSError):
        return 80


def _positive_int(text: str) -> int:
    value = int(text)
    if value <= 0:
        raise ValueError(text)
    return value


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0 or value == float("inf"):
        raise ValueError(text)
    return value


def _buffer_limits(text: str) -> tuple:
    parts = [int(p) for p in text.split(",")]
    if len(parts) > 2 or any(p < 0 for p in parts):
        raise ValueError(text)
    high, low = parts[0], (parts[1] if len(parts) == 2 else None)
    if low is not None and low > high:
        raise ValueError(text)
    return high, low


_positive_int.__name__ = "positive integer"
_seconds.__name__ = "number of seconds"
_buffer_limits.__name__ = "HIGH[,LOW] with HIGH >= LOW >= 0"


def build_parser(prog: str = "zmqpush.py") -> argparse.ArgumentParser:
    """The CLI; shared with zmqpush-watermark.py."""
    p = _Parser(
        prog=prog,
        description="Read lines on stdin and push each as JSON "
        '{"message":LINE,"type":LOGTYPE,"@pid":PID} over a ZeroMQ PUSH socket '
        "to a Logstash zeromq input. Diagnostics go to stderr; stdout is used "
        "only by --confirm.",
        epilog=HELP_EPILOG, formatter_class=_HelpFormatter)
    p.add_argument("logtype", nargs="?", metavar="LOGTYPE",
                   help='the "type" field (default: syslog)')
    p.add_argument("-c", "--connect", action="append", metavar="ENDPOINT",
                   help="connect to ENDPOINT (repeatable: round-robin over all); "
                   f"default {DEFAULT_ENDPOINT}")
    p.add_argument("--bind", action="append", metavar="ENDPOINT",
                   help='bind ENDPOINT instead (Logstash input mode => "client")')
    p.add_argument("--linger", type=_seconds, metavar="SECONDS",
                   help="at end of input, wait at most this long for delivery "
                   f"(default {DEFAULT_LINGER:g}, below rsyslog's closeTimeout of 5)")
    p.add_argument("--sndhwm", type=_positive_int, metavar="N",
                   help="ZeroMQ send high-water mark in messages per receiver (default "
                   f"{DEFAULT_SNDHWM}; with --batch, {BATCH_ZMQ_BYTES >> 20} MiB of batches)")
    p.add_argument("--write-buffer-limits", type=_buffer_limits, metavar="HIGH[,LOW]",
                   help="aiozmq transport watermarks in bytes (default "
                   f"{DEFAULT_WRITE_LIMITS[0]},{DEFAULT_WRITE_LIMITS[1]}; "
                   "LOW left out: HIGH/4)")
    p.add_argument("--queue-bytes", type=_positive_int, metavar="N",
                   help="bound of the queue between reader and sender, in bytes of "
                   f"encoded JSON (default {DEFAULT_QUEUE_BYTES})")
    p.add_argument("--max-line-bytes", type=_positive_int, metavar="N",
                   help="longer lines are split into messages marked "
                   f'"@continues":true (default {DEFAULT_MAX_LINE_BYTES})')
    p.add_argument("--batch", action="store_true", default=None,
                   help="send the lines of one read as one JSON array per message")
    p.add_argument("--batch-bytes", type=_positive_int, metavar="N",
                   help=f"read size, and so batch size cap (default {DEFAULT_READ_BYTES})")
    p.add_argument("--when-full", choices=("block", "drop"),
                   help="queue full: block the producer (default) or drop and count")
    p.add_argument("--heartbeat", type=_seconds, metavar="SECONDS",
                   help="ZeroMQ heartbeat interval; a peer silent for 3 intervals "
                   "is dropped and reconnected (default off)")
    p.add_argument("--confirm", action="store_true", default=None,
                   help='rsyslog omprog confirmMessages mode: print "OK" when ready, '
                   "then one reply line per line read")
    p.add_argument("--confirm-timeout", type=_seconds, metavar="SECONDS",
                   help="--confirm: how long a line may wait for ZeroMQ before it is "
                   f"refused (default {DEFAULT_CONFIRM_TIMEOUT:g})")
    p.add_argument("--host-field", action="store_true", default=None,
                   help='add "host": this host\'s name (Logstash would stamp its own)')
    p.add_argument("--host-field-ecs", action="store_true", default=None,
                   help='add "host":{"name": this host\'s name}, the form ECS '
                   "mappings (Logstash 8+ with Elasticsearch) accept")
    p.add_argument("--timestamp", action="store_true", default=None,
                   help='add "@timestamp": when the line was read, ISO 8601 UTC, ms')
    p.add_argument("-f", "--field", action="append", metavar="KEY=VALUE",
                   help="add a static string field (repeatable)")
    p.add_argument("--stats", type=_seconds, metavar="SECONDS",
                   help="print the counters on stderr every SECONDS")
    p.add_argument("--stats-format", choices=("text", "json"),
                   help="--stats and SIGUSR1 line format (default text)")
    p.add_argument("--progress", action="store_true", default=None,
                   help="a self-updating status line, only when stderr is a terminal")
    p.add_argument("-q", "--quiet", action="store_true", default=None,
                   help="no connection events; errors, the closing line and what "
                   "you asked for (--stats, SIGUSR1) still print")
    p.add_argument("--version", action="version", version=f"zmqpush {__version__}")
    return p


def _environment_defaults(parser: argparse.ArgumentParser, environ) -> dict:
    """ZMQPUSH_<DEST> values converted as their option would convert them."""
    defaults = {}
    for action in parser._actions:
        text = environ.get("ZMQPUSH_" + action.dest.upper())
        if text is None or action.dest in ("help", "version"):
            continue
        name = "ZMQPUSH_" + action.dest.upper()
        try:
            if action.nargs == 0:
                value = text.strip().lower() in ("1", "true", "yes", "on")
            elif isinstance(action, argparse._AppendAction):
                value = [v for v in re.split(r"[\s,]+", text) if v]
            elif action.type is not None:
                value = action.type(text)
            else:
                value = text
        except ValueError:
            raise UsageError(f"{name}: invalid value {text!r}") from None
        if action.choices and value not in action.choices:
            raise UsageError(f"{name}: {text!r} is not one of {', '.join(action.choices)}")
        defaults[action.dest] = value
    return defaults


# Keys zmqpush writes itself, or that Logstash gives a meaning: "@metadata" must
# be an object and "event" (ECS v8: [event][original]) too, or the whole frame
# becomes one _jsonparsefailure event; "tags" is Logstash's list and "@version" its
# own; "host" belongs to --host-field and --host-field-ecs (README "Logstash").
RESERVED_FIELDS = ("message", "type", "@pid", "@continues", "@timestamp",
                   "@metadata", "@version", "event", "tags", "host")


def extra_fields(specs: list, host_field: bool, host_field_ecs: bool = False) -> tuple:
    """(key, value) pairs from --host-field or --host-field-ecs, then -f KEY=VALUE.
    A value is a string, or {"name": hostname} for --host-field-ecs.  UsageError
    if both host options are given, a spec has no "=", or its key is refused by
    check_field_key."""
    if host_field and host_field_ecs:
        raise UsageError("--host-field and --host-field-ecs cannot be combined")
    fields = []
    if host_field or host_field_ecs:
        name = socket.gethostname()
        fields.append(("host", {"name": name} if host_field_ecs else name))
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise UsageError(f"bad field {spec!r} (expected KEY=VALUE)")
        check_field_key(key, fields)
        fields.append((key, value))
    return tuple(fields)


def check_field_key(key: str, fields: list):
    """UsageError if key is reserved, holds "[" or "]" (the Logstash Event keeps
    such a key as it is, but no field reference can name it), or is in fields."""
    if key in RESERVED_FIELDS:
        raise UsageError(f"field {key!r} is reserved (reserved: {', '.join(RESERVED_FIELDS)})")
    if "[" in key or "]" in key:
        raise UsageError(f"field {key!r} holds [ or ]: no Logstash field reference "
                         "can name it")
    if any(key == other for other, _ in fields):
        raise UsageError(f"field {key!r} given twice")


def check_endpoint(endpoint: str) -> str:
    """Return endpoint if it is well formed, else raise UsageError."""
    match = ENDPOINT_RE.match(endpoint)
    port = endpoint.rsplit(":", 1)[-1]
    if not match or (endpoint.startswith("tcp://") and port != "*" and int(port) > 65535):
        raise UsageError(f"bad endpoint {endpoint!r} (expected e.g. tcp://HOST:PORT, "
                         "ipc://PATH)")
    return endpoint


def parse_options(argv=None, environ=None) -> Config:
    """Parse argv (default sys.argv[1:]) and environ into a Config; UsageError if bad."""
    parser = build_parser()
    return config_from_args(parser, parser.parse_args(argv), environ)


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     environ=None) -> Config:
    """Merge parsed args over ZMQPUSH_* variables and validate; UsageError if bad."""
    env = _environment_defaults(parser, os.environ if environ is None else environ)
    opt = {action.dest: (getattr(args, action.dest) if getattr(args, action.dest, None)
                         is not None else env.get(action.dest))
           for action in parser._actions}
    connect = [check_endpoint(e) for e in opt["connect"] or []]
    bind = [check_endpoint(e) for e in opt["bind"] or []]
    if not connect and not bind:
        connect = [DEFAULT_ENDPOINT]
    if opt["confirm"] and opt["batch"]:
        raise UsageError("--confirm and --batch cannot be combined")
    high, low = opt["write_buffer_limits"] or DEFAULT_WRITE_LIMITS
    batch_bytes = opt["batch_bytes"] or DEFAULT_READ_BYTES
    default_sndhwm = (max(4, BATCH_ZMQ_BYTES // batch_bytes) if opt["batch"]
                      else DEFAULT_SNDHWM)
    return Config(
        logtype=opt["logtype"] if opt["logtype"] is not None else "syslog",
        connect=connect, bind=bind,
        linger=DEFAULT_LINGER if opt["linger"] is None else opt["linger"],
        sndhwm=opt["sndhwm"] or default_sndhwm,
        write_high=high, write_low=low,
        queue_bytes=opt["queue_bytes"] or DEFAULT_QUEUE_BYTES,
        max_line_bytes=opt["max_line_bytes"] or DEFAULT_MAX_LINE_BYTES,
        batch=bool(opt["batch"]),
        batch_bytes=batch_bytes,
        when_full=opt["when_full"] or "block",
        heartbeat=opt["heartbeat"] or None,
        confirm=bool(opt["confirm"]),
        confirm_timeout=(DEFAULT_CONFIRM_TIMEOUT if opt["confirm_timeout"] is None
                         else opt["confirm_timeout"]),
        quiet=bool(opt["quiet"]),
        fields=extra_fields(opt["field"] or [], bool(opt["host_field"]),
                            bool(opt["host_field_ecs"])),
        timestamp=bool(opt["timestamp"]),
        stats=opt["stats"] or None,
        stats_format=opt["stats_format"] or "text",
        progress=bool(opt["progress"]),
    )


# --------------------------------------------------------------- encoding --
# Owns the wire format: bytes of whole lines in, valid JSON messages out.

_escape = json.encoder.c_encode_basestring or json.encoder.py_encode_basestring
# Any JSON value (a field's string, the --host-field-ecs object), escaped as _escape does.
_compact_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
# Bytes that need JSON escaping: '"', '\\' and controls.  "\n" is left out:
# it separates lines and is replaced by the message structure itself.
_SPECIAL = bytes([0x22, 0x5C, *range(0x20)]).replace(b"\n", b"")
_NOT_SPECIAL = bytes(b for b in range(256) if b not in _SPECIAL)
_ESCAPES = {b: (json.dumps(chr(b))[1:-1]).encode() for b in _SPECIAL}
# A raw NUL never survives escaping, so it can split encoded messages.
_MESSAGE_MARK = b"\x00"


def iso8601_utc(epoch: float) -> str:
    """e.g. 2026-11-21T23:36:59.123Z"""
    millis = int(epoch * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + \
        f".{millis % 1000:03d}Z"


def valid_utf8(lines: bytes) -> bytes:
    """lines with each invalid UTF-8 sequence replaced by U+FFFD, exactly as
    decode("utf-8", "replace") would; valid lines come back as they are.
    (Decoding in slices, or only from the first error on, measured slower on
    real chunks: the cost is building the text, not finding the error.)"""
    if not lines.isascii():
        try:
            lines.decode("utf-8")
        except UnicodeDecodeError:
            return lines.decode("utf-8", "replace").encode("utf-8")
    return lines


def valid_text(text: str) -> str:
    """text with each byte that was not UTF-8 in argv or the environment (which
    Python keeps as a surrogate escape, and which cannot be encoded) replaced
    by U+FFFD, as valid_utf8 does for lines."""
    return valid_utf8(text.encode("utf-8", "surrogateescape")).decode("utf-8")


def escape_utf8_lines(lines: bytes) -> bytes:
    """JSON-escape the text of lines, as UTF-8 bytes, keeping b"\\n" between lines.

    Invalid UTF-8 becomes U+FFFD (see valid_utf8); only the special bytes that
    occur cost a pass each.
    """
    lines = valid_utf8(lines)
    present = lines.translate(None, _NOT_SPECIAL)
    if present:
        if b"\\" in present:
            lines = lines.replace(b"\\", b"\\\\")  # first: later escapes add backslashes
        for byte in set(present) - {0x5C}:
            lines = lines.replace(bytes((byte,)), _ESCAPES[byte])
    return lines


class Encoder:
    """Turns chunks of complete lines into JSON messages, in bulk.

    Contract: for any bytes, every message is valid RFC 8259 JSON whose
    "message" is the line decoded as UTF-8 with U+FFFD for invalid bytes,
    followed by "type" and "@pid" in that order (and the extra fields).
    Work is per chunk, on bytes: a few C passes, none per line.
    """

    def __init__(self, logtype: str, pid: int, batch: bool, fields: tuple = (),
                 timestamp: bool = False):
        self._head = b'{"message":"'
        self._tail = valid_text('","type":' + _escape(logtype) + ',"@pid":' + str(pid)
                                + "".join("," + _escape(k) + ":" + _compact_json(v)
                                          for k, v in fields))
        self._timestamp = timestamp
        self._batch = batch

    def encode(self, lines: bytes, strip_cr: bool = True, continues: bool = False,
               read_at: float = 0.0) -> tuple:
        """Encode lines (each ending in b"\\n"; CR before it stripped if strip_cr).

        Returns (messages, number of lines): one message per line, or in batch
        mode one JSON array.
        continues marks a piece of an over-long line that the next message goes on;
        read_at (epoch seconds) is the "@timestamp" when that field is on.
        """
        if strip_cr and b"\r" in lines:
            lines = lines.replace(b"\r\n", b"\n")
        tail = self._tail
        if self._timestamp:
            tail += ',"@timestamp":"' + iso8601_utc(read_at) + '"'
        tail = (tail + (',"@continues":true}' if continues else "}")).encode("utf-8")
        between = tail + (b"," if self._batch else _MESSAGE_MARK) + self._head
        escaped = escape_utf8_lines(lines)
        body = escaped.replace(b"\n", between)
        count = (len(body) - len(escaped)) // (len(between) - 1)
        body = memoryview(body)[:-len(between)]  # the last line's own tail comes next
        if self._batch:
            return [b"".join((b"[", self._head, body, tail, b"]"))], count
        return b"".join((self._head, body, tail)).split(_MESSAGE_MARK), count


# ---------------------------------------------------------------- reading --
# Owns stdin: non-blocking reads woken by an edge-triggered epoll, line framing,
# and the byte-bounded queue that carries encoded messages to the sender.

class Segment(NamedTuple):
    """A run of complete lines, or one piece of an over-long line."""

    lines: bytes
    strip_cr: bool = True
    continues: bool = False


class LineFramer:
    """Splits a byte stream into Segments; keeps the unfinished last line.

    No line longer than max_line_bytes is ever held: longer ones leave as
    pieces cut at UTF-8 character boundaries, all but the last marked continues.
    """

    def __init__(self, max_line_bytes: int):
        self._max = max_line_bytes
        self._pending = bytearray()

    def feed(self, data: bytes) -> list:
        """Segments completed by data, in order."""
        newline = data.rfind(b"\n")
        if newline < 0:
            self._pending += data
            return self._split_pending()
        view = memoryview(data)
        complete = (b"".join((self._pending, view[: newline + 1])) if self._pending
                    else data[: newline + 1])
        self._pending = bytearray(view[newline + 1:])
        return self._segments(complete) + self._split_pending()

    def finish(self) -> list:
        """The unfinished last line (no newline at EOF), if any."""
        if not self._pending:
            return []
        last, self._pending = bytes(self._pending) + b"\n", bytearray()
        return [Segment(last, strip_cr=False)]

    def _segments(self, complete: bytes) -> list:
        if len(complete) <= self._max + 2:
            return [Segment(complete)]
        lines = complete.split(b"\n")[:-1]
        if max(map(len, lines)) <= self._max + 1:
            return [Segment(complete)]
        out, run = [], []
        for line in lines:
            if len(line) <= self._max + (line[-1:] == b"\r"):
                run.append(line)
                continue
            if run:
                out.append(Segment(b"\n".join(run) + b"\n"))
                run = []
            out.extend(self._pieces(line))
        if run:
            out.append(Segment(b"\n".join(run) + b"\n"))
        return out

    def _pieces(self, line: bytes) -> list:
        out = []
        while len(line) > self._max + (line[-1:] == b"\r"):
            cut = self._cut(line)
            out.append(Segment(line[:cut] + b"\n", strip_cr=False, continues=True))
            line = line[cut:]
        out.append(Segment(line + b"\n"))
        return out

    def _split_pending(self) -> list:
        out = []
        while len(self._pending) > self._max:
            cut = self._cut(self._pending)
            out.append(Segment(bytes(self._pending[:cut]) + b"\n",
                               strip_cr=False, continues=True))
            del self._pending[:cut]
        return out

    def _cut(self, line) -> int:
        """Where to end a piece of at most max bytes: not inside a UTF-8
        character, not between CR and what follows it."""
        cut = back = self._max
        while back > cut - 3 and back > 1 and 0x80 <= line[back] < 0xC0:
            back -= 1
        if not 0x80 <= line[back] < 0xC0:  # a character starts there
            cut = back
        if line[cut - 1] == 0x0D and cut > 1:
            cut -= 1
        return cut


class Batch(NamedTuple):
    """What the reader hands the sender: encoded messages of one read."""

    messages: list
    events: list  # events carried by each message (1, or lines in a batch array)
    ends_line: list  # False for a piece that the next message continues
    nbytes: int


class ByteQueue(asyncio.Queue):
    """asyncio.Queue bounded by the total nbytes of its Batches, not their count.

    put() waits while the queue holds maxsize bytes or more, so it holds at
    most maxsize bytes plus one Batch.
    """

    def _init(self, maxsize):
        super()._init(maxsize)
        self.nbytes = 0

    def _put(self, item):
        self.nbytes += item.nbytes
        super()._put(item)

    def _get(self):
        item = super()._get()
        self.nbytes -= item.nbytes
        return item

    def full(self) -> bool:
        return self.nbytes >= self.maxsize

    def events(self) -> int:
        """Events waiting in the queue."""
        return sum(sum(b.events) for b in self._queue if b is not END)


class _End(NamedTuple):
    nbytes: int = 0


END = _End()


class StdinReader:
    """Reads fd until EOF or stop(), framing and encoding, feeding a ByteQueue.

    Owns the descriptor's O_NONBLOCK flag (restored by close()) and the epoll
    object.  While the queue is full it stops reading (policy "block": the
    pipe fills and the producer blocks) or drops and counts (policy "drop").
    Regular files and /dev/null cannot be polled: they are read directly.
    `ended` is set at EOF or stop(), even while the last puts still wait for room.
    """

    def __init__(self, fd: int, queue: ByteQueue, *, encoder: Encoder, framer: LineFramer,
                 counters: Counters, read_bytes: int, drop_when_full: bool):
        self._fd = fd
        self._queue = queue
        self._encoder = encoder
        self._framer = framer
        self._counters = counters
        self._read_bytes = read_bytes
        self._drop = drop_when_full
        self._stopping = False
        self.ended = asyncio.Event()
        self._read_at = time.time()
        self._waiter: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self._flags = None
        self._epoll = self._watch()

    def _watch(self):
        """Non-blocking fd in an edge-triggered epoll watched by the loop, or None."""
        epoll = select.epoll()
        try:
            epoll.register(self._fd, select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET)
        except PermissionError:
            epoll.close()
            return None
        self._flags = os.get_blocking(self._fd)
        os.set_blocking(self._fd, False)
        self._loop.add_reader(epoll.fileno(), self._on_epoll)
        return epoll

    def _on_epoll(self):
        self._epoll.poll(0)
        self._wake()

    def _wake(self):
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def stop(self):
        """Stop reading soon; what was read (an unfinished line too) is still sent."""
        self._stopping = True
        self.ended.set()
        self._wake()

    def close(self):
        """Unwatch and restore the descriptor's blocking flag."""
        if self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None
        if self._flags is not None:
            os.set_blocking(self._fd, self._flags)
            self._flags = None

    async def run(self):
        """Read until EOF or stop(); then hand over the unfinished line and END."""
        while not self._stopping:
            data = await self._read()
            if not data:
                break
            self._read_at = time.time()
            await self._hand_over(self._framer.feed(data), len(data))
        self.ended.set()
        await self._hand_over(self._framer.finish(), 0)
        await self._queue.put(END)

    async def _read(self) -> bytes:
        """The next bytes of stdin; waits on epoll when none are ready.
        Returns b"" at EOF or when stopped."""
        while not self._stopping:
            try:
                return os.read(self._fd, self._read_bytes)
            except BlockingIOError:
                self._waiter = self._loop.create_future()
                await self._waiter
                self._waiter = None
            except OSError as exc:
                if exc.errno == errno.EIO:
                    return b""
                raise
        return b""

    async def _hand_over(self, segments: list, nread: int):
        """Encode segments into one Batch and queue it (or drop it when full)."""
        self._counters.bytes_read += nread
        if not segments:
            return
        messages, events, ends = [], [], []
        for seg in segments:
            encoded, count = self._encoder.encode(seg.lines, seg.strip_cr, seg.continues,
                                                  self._read_at)
            messages += encoded
            events += [count] if len(encoded) == 1 else [1] * count
            ends += [True] * (len(encoded) - 1) + [not seg.continues]
            self._counters.pieces += seg.continues
        batch = Batch(messages, events, ends, sum(map(len, messages)))
        nevents = sum(events)
        self._counters.events_read += nevents
        if self._drop and self._queue.full():
            self._counters.events_dropped += nevents
            return
        await self._queue.put(batch)
        await asyncio.sleep(0)


# ---------------------------------------------------------------- sending --
# Owns the PUSH socket: its options, the aiozmq stream, flow control, and what
# was handed to ZeroMQ.

def import_aiozmq():
    """Import aiozmq, also on Python 3.14+ where its module import fails.

    aiozmq 1.0 imports asyncio's SafeChildWatcher (removed in 3.14) for its own
    event-loop policy only, which zmqpush never uses: a stand-in lets it load.
    """
    from asyncio import unix_events
    if not hasattr(unix_events, "SafeChildWatcher"):
        unix_events.SafeChildWatcher = type("SafeChildWatcher", (), {})
    import aiozmq
    return aiozmq


def configure_socket(sock, config: Config):
    """Set the socket options that make outages safe (see README "Outages")."""
    import zmq
    sock.setsockopt(zmq.SNDHWM, config.sndhwm)
    sock.setsockopt(zmq.LINGER, -1)
    sock.setsockopt(zmq.IMMEDIATE, 1 if config.confirm else 0)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    if config.heartbeat:
        ivl = max(1, int(config.heartbeat * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)


async def open_stream(config: Config):
    """A connected (or bound) aiozmq PUSH stream.  OSError from ZeroMQ on a bad
    or unusable endpoint; the socket is closed then."""
    import zmq
    aiozmq = import_aiozmq()
    context = zmq.Context()
    sock = context.socket(zmq.PUSH)
    configure_socket(sock, config)
    try:
        stream = await aiozmq.create_zmq_stream(
            zmq.PUSH, zmq_sock=sock, bind=config.bind or None,
            connect=config.connect or None,
            high_write=config.write_high, low_write=config.write_low)
    except OSError:
        sock.close(linger=0)
        context.term()
        raise
    return stream, context


class Sender:
    """Takes Batches from the queue and hands their messages to ZeroMQ, in order.

    Messages go straight to the socket with DONTWAIT.  When ZeroMQ would block,
    the sender spills messages into the aiozmq transport's buffer until that
    buffer passes its low watermark (or a message goes straight through again),
    then awaits drain() until aiozmq has sent all of the spill (the transport's
    limits are lowered to zero for that wait, so drain() returns exactly when
    the buffer is empty), then goes back to direct sends.  It takes nothing
    from the queue meanwhile, so what it holds is one Batch plus at most the
    low watermark and one message.

    aiozmq sends its buffer one message per event-loop turn, about ten times
    the cost of a direct send: hence the default low watermark of 0 (spill only
    the refused message) and the backend's send, which skips pyzmq's wrapper.
    """

    def __init__(self, stream, queue: ByteQueue, counters: Counters):
        import zmq
        self._again = zmq.Again
        self._dontwait = zmq.DONTWAIT
        self._stream = stream
        self._transport = stream.transport
        self._sock = stream.transport.get_extra_info("zmq_socket")
        self._send_frame = zmq.backend.Socket.send.__get__(self._sock)  # bytes only
        self._low, self._high = self._transport.get_write_buffer_limits()
        self._queue = queue
        self._counters = counters
        # (bytes written to the transport so far, events in that message)
        self._in_transport: collections.deque = collections.deque()
        self._written_bytes = 0

    async def run(self):
        """Send Batches until END, then until the transport buffer is empty."""
        while True:
            batch = await self._queue.get()
            if batch is END:
                break
            await self._send(batch.messages, batch.events)
        await self._flush_transport()

    async def _send(self, messages: list, events: list):
        """Hand all messages over in order; waits while ZeroMQ would block."""
        sent = 0
        while sent < len(messages):
            sent = self._send_directly(messages, events, sent)
            if sent < len(messages):
                sent = self._spill(messages, events, sent)
                await self._flush_transport()

    def _send_directly(self, messages: list, events: list, first: int) -> int:
        """Send from messages[first] on until ZeroMQ would block; returns the next index."""
        send, flags, sent = self._send_frame, self._dontwait, first
        try:
            for message in messages[first:] if first else messages:
                send(message, flags)
                sent += 1
        except self._again:
            pass
        self._counters.events_handed += sum(events[first:sent])
        return sent

    def _spill(self, messages: list, events: list, first: int) -> int:
        """Write messages into the transport until its buffer passes the low
        watermark, or until one goes straight through (ZeroMQ takes them again)."""
        index = first
        while index < len(messages):
            self._transport.write([messages[index]])
            self._written_bytes += len(messages[index])
            self._in_transport.append((self._written_bytes, events[index]))
            index += 1
            if not 0 < self._transport.get_write_buffer_size() <= self._low:
                break
        return index

    async def _flush_transport(self):
        """Wait until aiozmq has handed its whole buffer to ZeroMQ."""
        if self._transport.get_write_buffer_size():
            self._counters.drain_waits += 1
            self._transport.set_write_buffer_limits(high=0, low=0)
            try:
                await self._stream.drain()
            finally:
                self._transport.set_write_buffer_limits(high=self._high, low=self._low)
        self._settle()

    def _settle(self):
        """Count events that left the transport buffer for ZeroMQ."""
        sent_bytes = self._written_bytes - self._transport.get_write_buffer_size()
        while self._in_transport and self._in_transport[0][0] <= sent_bytes:
            self._counters.events_handed += self._in_transport.popleft()[1]

    async def send_confirmed(self, batch: Batch, timeout: float, on_line) -> None:
        """--confirm: hand over each message, waiting at most timeout for ZeroMQ
        to accept it, and call on_line(accepted) as soon as each line is decided.

        A message that timed out stays in the transport (so it may still go out,
        and its retry by rsyslog make a duplicate); while it is there, new
        messages are refused without being kept, so memory stays bounded."""
        line_ok = True
        for message, nevents, ends in zip(batch.messages, batch.events, batch.ends_line):
            accepted = await self._flushed_within(timeout)
            if accepted and not self._send_directly([message], [nevents], 0):
                self._spill([message], [nevents], 0)
                accepted = await self._flushed_within(timeout)
            line_ok = line_ok and accepted
            if ends:
                on_line(line_ok)
                line_ok = True

    async def _flushed_within(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._flush_transport(), timeout)
        except asyncio.TimeoutError:
            self._settle()
            return False
        return True

    def buffered_bytes(self) -> int:
        return self._transport.get_write_buffer_size()

    @property
    def socket(self):
        """The PUSH socket (the reporter monitors it)."""
        return self._sock


# -------------------------------------------------------------- lifecycle --
# Owns the run: counters and what is reported of them, signals, the
# end-of-input linger and the exit code.

class Counters:
    """What happened so far, counted where it happens (reader, sender, monitor)."""

    def __init__(self):
        self.bytes_read = 0
        self.events_read = 0
        self.events_handed = 0
        self.events_dropped = 0
        self.pieces = 0
        self.drain_waits = 0
        self.connected = 0

    def not_handed(self) -> int:
        """Events read and not dropped that ZeroMQ has not accepted (yet)."""
        return self.events_read - self.events_dropped - self.events_handed


class Reporter:
    """Everything zmqpush says about itself while it runs, on stderr: --stats
    lines, SIGUSR1, the --progress line, and connection events read from a
    ZeroMQ socket monitor (which also counts connected receivers).  Its timers
    exist only when --stats or --progress asked for them."""

    EVENT_REPEAT_SECONDS = 5.0

    def __init__(self, config: Config, counters: Counters, queue: ByteQueue, sender: Sender):
        self._config = config
        self._counters = counters
        self._queue = queue
        self._sender = sender
        self._last = (time.monotonic(), 0)
        self._timers: list = []
        self._progress = config.progress and os.isatty(2)
        self._event_last: dict = {}
        self._sock = sender.socket
        self._monitor = None
        self._monitor_fd = -1

    def snapshot(self) -> dict:
        """The counters now, with the send rate since the previous snapshot."""
        c = self._counters
        now, sent_before = time.monotonic(), self._last[1]
        rate = (c.events_handed - sent_before) / max(1e-9, now - self._last[0])
        self._last = (now, c.events_handed)
        return {"read": c.events_read, "bytes": c.bytes_read, "sent": c.events_handed,
                "queued": self._queue.events(), "dropped": c.events_dropped,
                "split": c.pieces, "transport_bytes": self._sender.buffered_bytes(),
                "drain_waits": c.drain_waits, "connected": c.connected,
                "rate": round(rate, 1)}

    def print_stats(self):
        """One counters line: "zmqpush: read=N ..." or, with --stats-format json, an object."""
        values = self.snapshot()
        if self._config.stats_format == "json":
            write_stderr(json.dumps(values, separators=(",", ":")) + "\n")
        else:
            warn(" ".join(f"{k}={v}" for k, v in values.items()))

    def start(self):
        """Start the connection monitor, and the timers that were asked for."""
        loop = asyncio.get_running_loop()
        if self._config.stats:
            self._every(loop, self._config.stats, self.print_stats)
        if self._progress:
            self._every(loop, 0.5, self._print_progress)
        self._start_monitor(loop)

    def _every(self, loop, seconds: float, action):
        def tick():
            action()
            self._timers[index] = loop.call_later(seconds, tick)
        index = len(self._timers)
        self._timers.append(loop.call_later(seconds, tick))

    def stop(self):
        """Cancel the timers and stop the monitor (before the socket closes)."""
        for timer in self._timers:
            timer.cancel()
        self._stop_monitor()
        if self._progress:
            self._print_progress()
            write_stderr("\n")

    def _print_progress(self):
        v = self.snapshot()
        state = f"{v['connected']} connected" if v["connected"] else "waiting for a receiver"
        write_stderr(f"\r\x1b[Kzmqpush: {v['rate']:,.0f} lines/s, {v['sent']:,} sent, "
                     f"{v['queued']:,} queued, {v['dropped']:,} dropped, {state}")

    def _start_monitor(self, loop):
        """A pyzmq monitor socket for the PUSH socket, watched by the loop.

        (aiozmq's own monitor misses events over inproc with this loop and can
        block at close.)  Only the three events used are asked for, so libzmq
        never has to send a "monitor stopped" event at the end."""
        import zmq
        events = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | \
            zmq.EVENT_CONNECT_RETRIED
        self._monitor = self._sock.get_monitor_socket(events)
        self._monitor_fd = self._monitor.getsockopt(zmq.FD)
        loop.add_reader(self._monitor_fd, self._read_events)
        loop.call_soon(self._read_events)

    def _stop_monitor(self):
        if self._monitor is None:
            return
        asyncio.get_running_loop().remove_reader(self._monitor_fd)
        self._read_events()
        self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._monitor = None

    def _read_events(self):
        """Handle every monitor event ready now (ZeroMQ's FD signals edges only)."""
        import zmq
        while self._monitor is not None and \
                self._monitor.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            head, endpoint = self._monitor.recv_multipart(zmq.NOBLOCK)
            event = int.from_bytes(head[:2], sys.byteorder)  # then a 32-bit value
            self._on_event(event, endpoint.decode(errors="replace"), zmq)

    def _on_event(self, event: int, endpoint: str, zmq):
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._counters.connected += 1
            self._say("connected", endpoint)
        elif event == zmq.EVENT_DISCONNECTED:
            self._counters.connected = max(0, self._counters.connected - 1)
            self._say("disconnected", endpoint)
        elif event == zmq.EVENT_CONNECT_RETRIED:
            self._say("retrying", endpoint)

    def _say(self, what: str, endpoint: str):
        """One line per event, at most one per kind and endpoint every 5 s."""
        if self._config.quiet:
            return
        now = time.monotonic()
        last, skipped = self._event_last.get((what, endpoint), (-1e9, 0))
        if now - last < self.EVENT_REPEAT_SECONDS:
            self._event_last[(what, endpoint)] = (last, skipped + 1)
            return
        more = f" ({skipped} more since last said)" if skipped else ""
        self._event_last[(what, endpoint)] = (now, 0)
        warn(f"receiver {what} {endpoint}{more}")


def write_stderr(text: str):
    """Write to stderr; never fails (stderr may be a closed pipe)."""
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def warn(text: str):
    """One diagnostic line on stderr, prefixed "zmqpush: "."""
    write_stderr(f"zmqpush: {text}\n")


class Shipper:
    """One run: stdin -> queue -> ZeroMQ, until EOF or a signal, then linger."""

    def __init__(self, config: Config, stdin_fd: int = 0):
        self.config = config
        self.counters = Counters()
        self._stdin_fd = stdin_fd
        self._started = time.perf_counter()
        self._stop_signals = 0
        self._deadline = 0.0
        self._reader: StdinReader | None = None
        self._sender: Sender | None = None
        self._queue: ByteQueue | None = None
        self._reporter: Reporter | None = None

    async def run(self) -> int:
        """Ship stdin; returns the exit code."""
        config = self.config
        try:
            stream, context = await open_stream(config)
        except OSError as exc:
            warn(f"cannot use endpoint {' '.join(config.connect + config.bind)}: "
                 f"{exc.strerror or exc}")
            return EXIT_USAGE if exc.errno in (errno.EINVAL, errno.EPROTONOSUPPORT,
                                              errno.ENODEV) else EXIT_ERROR
        self._queue = ByteQueue(config.queue_bytes)
        encoder = Encoder(config.logtype, os.getpid(), config.batch, config.fields,
                          config.timestamp)
        read_bytes = config.batch_bytes if config.batch else DEFAULT_READ_BYTES
        self._reader = StdinReader(
            self._stdin_fd, self._queue, encoder=encoder,
            framer=LineFramer(config.max_line_bytes), counters=self.counters,
            read_bytes=read_bytes, drop_when_full=config.when_full == "drop")
        self._sender = Sender(stream, self._queue, self.counters)
        self._reporter = Reporter(config, self.counters, self._queue, self._sender)
        self._reporter.start()
        self._install_signals()
        try:
            not_handed = await self._ship()
        finally:
            self._reader.close()
            self._reporter.stop()
        delivered = await self._close(stream, context)
        return self._report(not_handed, delivered)

    async def _ship(self) -> int:
        """Run reader and sender; after input ends, give them --linger seconds.
        Returns the events that were read but not handed to ZeroMQ."""
        if self.config.confirm:
            reply("OK")
            sender = self._confirm_loop()
        else:
            sender = self._sender.run()
        reader_task = asyncio.ensure_future(self._reader.run())
        sender_task = asyncio.ensure_future(sender)
        input_ended = asyncio.ensure_future(self._reader.ended.wait())
        await asyncio.wait([input_ended, sender_task], return_when=asyncio.FIRST_COMPLETED)
        input_ended.cancel()
        self._deadline = time.monotonic() + self.config.linger
        done, pending = await asyncio.wait([reader_task, sender_task],
                                           timeout=self.config.linger)
        for task in pending:
            task.cancel()
        for task in done:
            if task.exception() is not None:
                raise task.exception()
        return self.counters.not_handed()

    async def _confirm_loop(self):
        """--confirm: the sender loop that replies to rsyslog on stdout."""
        while True:
            batch = await self._queue.get()
            if batch is END:
                return
            await self._sender.send_confirmed(batch, self.config.confirm_timeout,
                                              self._reply_to_rsyslog)

    def _reply_to_rsyslog(self, accepted: bool):
        if not reply("OK" if accepted else "zmqpush: not accepted by ZeroMQ in time"):
            self._reader.stop()

    async def _close(self, stream, context) -> bool:
        """Close with what is left of --linger.  True if ZeroMQ delivered all it
        held: its termination returned before the linger ran out.  With
        --linger 0 nothing is waited for and pending messages are not judged."""
        import zmq
        remaining = max(0.0, self._deadline - time.monotonic())
        sock = stream.transport.get_extra_info("zmq_socket")
        sock.setsockopt(zmq.LINGER, int(remaining * 1000))
        if self._sender.buffered_bytes():
            stream.transport.abort()
        else:
            stream.close()
        await asyncio.sleep(0)
        if not sock.closed:
            sock.close()
        began = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, context.term)
        return self.config.linger == 0 or time.monotonic() - began + 0.01 < remaining

    def _report(self, not_handed: int, delivered: bool) -> int:
        counters = self.counters
        elapsed = (time.perf_counter() - self._started) * 1000
        code = EXIT_OK
        if not_handed > 0:
            warn(f"{not_handed} messages were not handed to ZeroMQ within "
                 f"--linger {self.config.linger:g}s (receiver down or too slow)")
            code = EXIT_UNDELIVERED
        if not delivered:
            warn("ZeroMQ still held undelivered messages (at most --sndhwm "
                 f"{self.config.sndhwm} per receiver) when --linger ran out")
            code = EXIT_UNDELIVERED
        closing = (f"Processed {counters.events_handed} messages in {elapsed:.4f}ms. "
                   f"Tagged with @pid:{os.getpid()}")
        if counters.events_dropped:
            closing += f". Dropped {counters.events_dropped} messages (queue full)"
        write_stderr(closing + "\n")
        return code

    def _install_signals(self):
        loop = asyncio.get_running_loop()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        loop.add_signal_handler(signal.SIGTERM, self._on_stop_signal, signal.SIGTERM)
        if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
            loop.add_signal_handler(signal.SIGINT, self._on_stop_signal, signal.SIGINT)
        loop.add_signal_handler(signal.SIGUSR1, self._reporter.print_stats)

    def _on_stop_signal(self, signum: int):
        """First SIGTERM/SIGINT: stop reading and linger.  Second: exit now."""
        self._stop_signals += 1
        if self._stop_signals == 1:
            self._reader.stop()
            return
        warn(f"interrupted: {self.counters.not_handed()} messages not handed to ZeroMQ")
        os._exit(EXIT_SIGNAL_BASE + signum)


def reply(text: str) -> bool:
    """--confirm: one protocol line on stdout.  False if rsyslog has gone."""
    try:
        os.write(1, (text + "\n").encode())
        return True
    except OSError:
        return False


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop if uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv=None) -> int:
    """The command line: returns the exit code (see --help)."""
    try:
        config = parse_options(argv)
    except UsageError as exc:
        warn(f"{exc} (see --help)")
        return EXIT_USAGE
    loop = new_event_loop()
    try:
        return loop.run_until_complete(Shipper(config).run())
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
