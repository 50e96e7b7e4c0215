#!/usr/bin/env python3
"""zmqpush: read log lines on stdin, push them as JSON over a ZeroMQ PUSH socket.

Every line becomes {"message":LINE,"type":LOGTYPE,"@pid":PID}, the wire format
the Logstash zeromq input (codec json) turns into one event.  The file is in
dependency order, each part before its first user (sections open with what they
own):

  options      the command line, its ZMQPUSH_* twins, Config, the memory budget
  security     CURVE certificates, allowlists, the ZAP handler (Gatekeeper)
  encoding     zmqpush's own keys (OwnKeys); lines in, JSON out (plain, --json, --journal)
  framing      the counters, line framing (Segments)
  multi-line rules   the presets and --multiline-pattern
  joining      the Joiner and its views, Joined events
  queue        the sink interface (memory queue) and --confirm's replies
  pipeline     framing -> stages (containers, joining) -> encoder -> sink, built
               once from the options
  input        stdin, feeding the pipeline; the heap trimmed as it is read
  spooling     the disk sink (--spool)
  sockets      the PUSH sockets, endpoints, descriptors, connection monitors
  sending      the replay window, ZeroMQ's held queue, flow control, --confirm,
               --stdout's writer (the sender's stand-in without ZeroMQ)
  reporting    stderr diagnostics, --stats, metrics, systemd notify, watchdog
  lifecycle    Shipper: wiring, supervision, signals, linger, the exit code
"""
from __future__ import annotations

import os
import signal
import sys

if __name__ == "__main__":
    # Before the slow imports.  A SIGTERM or SIGINT (unless ignored) that comes
    # while zmqpush starts waits, blocked, until the run takes it (see
    # Shipper._install_signals): it neither kills the process nor raises
    # KeyboardInterrupt inside an import.  rsyslog may forward HUP (or USR1) at
    # any moment, and their default action would kill the process: the run's
    # own handlers replace these dispositions later.  (HUP ignored shows that
    # the others are blocked.)  A SIGINT that came while CPython looked at
    # this file's path, just before running it, was printed as a
    # KeyboardInterrupt and dropped (sys.last_value): sent again, it waits too.
    # Only when CPython runs this file itself (no frame calls it): in a REPL
    # that ran it (runpy, IPython's %run), sys.last_value is an older Ctrl-C's.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM} | (
        {signal.SIGINT} if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN else set()))
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if sys._getframe().f_back is None and isinstance(getattr(sys, "last_value", None),
                                                     KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)

import argparse
import asyncio
import bisect
import collections
import errno
import fcntl
import functools
import itertools
import json
import json.encoder
import operator
import re
import select
import socket
import stat
import struct
import termios
import threading
import time
import warnings
from codecs import utf_8_decode as _utf8_decode
from collections.abc import Callable
from typing import NamedTuple

__version__ = "1.0.0"

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_UNDELIVERED = 3
EXIT_SIGNAL_BASE = 128

DEFAULT_ENDPOINT = "tcp://127.0.0.1:2120"
DEFAULT_LINGER = 4.0
# ZeroMQ delivered all it held at the close if it ended this long before --linger did.
LINGER_MARGIN = 0.01
DEFAULT_SNDHWM = 1000
# --confirm without a spool answers "OK" once ZeroMQ took a line: what its queue
# holds when zmqpush ends is lost, so it holds one message (the kernel's buffers
# still deliver after the exit).  Not with --confirm-timeout 0: ZeroMQ takes the
# next message only once its I/O thread took the last, which "at once" cannot wait for.
CONFIRM_SNDHWM = 1
# In --batch mode a message is a whole read: SNDHWM defaults to this many bytes of them.
BATCH_ZMQ_BYTES = 16 << 20
DEFAULT_QUEUE_BYTES = 4 << 20
DEFAULT_MAX_LINE_BYTES = 64 << 10
DEFAULT_READ_BYTES = 256 << 10
DEFAULT_CONFIRM_TIMEOUT = 2.0
# Reads at most once per window while lines keep coming (README "Coalesced reads").
DEFAULT_COALESCE = 0.05
MAX_COALESCE = 1.0
# aiozmq transport (high, low): the sender spills into it until it passes low, so
# 0 spills only the message ZeroMQ refused (see Sender).
DEFAULT_WRITE_LIMITS = (64 << 10, 0)
RECONNECT_IVL_MS = 100
PEER_FRAME_MOST = 64 << 10
HANDSHAKE_MS = 5000
RECONNECT_IVL_MAX_MS = 1000
# Replay (README "Outages"): the window must cover what a stock receiver and the
# kernels may hold when it goes away: its RCVHWM (libzmq's default, 1000
# messages), its kernel's receive buffer (Linux's default tcp_rmem maximum),
# our kernel's send buffer (SNDBUF, set) and our own ZeroMQ queue.
DEFAULT_REPLAY_BYTES = 16 << 20
STOCK_RCVHWM = 1000
RECEIVER_KERNEL_BYTES = 6 << 20
REPLAY_SNDBUF = 1 << 20
# --batch with replay: ZeroMQ's queue holds this many bytes of arrays.
REPLAY_BATCH_ZMQ_BYTES = 1 << 20
# The window is emptied after two checks this far apart, while the sender is
# idle, both finding no backpressure and empty kernel send queues.
REPLAY_QUIET = 0.5
# A receiver gone away: the replay waits until its socket no longer takes
# messages, looking this often, at most this long (see Shipper._on_receiver_lost).
REPLAY_LOOK = 0.001
REPLAY_WAIT_MOST = 0.05
# Default mode: ZeroMQ's queue holds about this much, checked at tracked
# messages (checkpoints) this far apart (see ZeroMQHeld).
PIPE_BYTES = 4 << 20
CHECKPOINT_BYTES = PIPE_BYTES // 8
# Worst-case memory (README "Flow control and memory"), measured: the interpreter
# and libraries, plus what each setting can hold; settings over --memory-bytes
# are refused.
DEFAULT_MEMORY_BYTES = 64 << 20
MEMORY_BASE = 30 << 20
MEMORY_PER_LINE_BYTE = 16  # escaping (up to 6x), encoding copies, ZeroMQ's queue
# Disk spool (README "Outages"): its default cap and flush interval (measured
# with bench/spool.py), and its replay window, which is on disk and so may cover
# a receiver host's tcp_rmem maximum raised to 32 MiB (at most a quarter of the cap).
DEFAULT_SPOOL_BYTES = 1 << 30
MIN_SPOOL_BYTES = 1 << 20
MAX_SPOOL_BYTES = 1 << 50
DEFAULT_SPOOL_SYNC = 1.0
SPOOL_REPLAY_BYTES = 64 << 20
# Multi-line events (README "Multi-line events"): the presets, the defaults, and
# how much of a line a --multiline-pattern is matched against (a bound on what
# a slow pattern can cost per line).
MULTILINE_PRESETS = ("python", "java", "go", "ruby", "php", "node")
# 1,100 lines: a JVM's StackOverflowError (1,024 frames by default) stays one event;
# the cap in bytes (--max-line-bytes) is what memory_need counts of a joined event.
DEFAULT_MULTILINE_MAX_LINES = 1100
DEFAULT_MULTILINE_TIMEOUT = 3.0
MULTILINE_MATCH_BYTES = 256
# Joining per source (--multiline with --json or --journal, see ObjectView):
# journald's fields of one process's lines (systemd.journal-fields(7)), what the
# sources pending at once hold together at most (each held line counted with
# MULTILINE_LINE_OVERHEAD for its record, its message and their slots), and how
# many sources may be pending at once; past either, the oldest pending event
# leaves.  MEMORY_PER_HELD_BYTE: a held line's bytes, its message as text and as
# the rule's bytes (measured with tracemalloc: at most 3.1, for messages of emoji;
# 1 to 3 for ASCII).  At the defaults the 1 MiB this takes and --json's parsed
# objects fit --memory-bytes with a smaller queue, the replay window kept whole.
JOURNAL_SOURCE_KEYS = ("_HOSTNAME", "_SYSTEMD_UNIT", "_PID")
MULTILINE_SOURCE_BYTES = 256 << 10
MULTILINE_SOURCES = 256
MULTILINE_LINE_OVERHEAD = 256
MEMORY_PER_HELD_BYTE = 4
# Container logs (--docker, --cri, README "Structured logs", see Unwrapping): the
# key that tells sources apart for --multiline, how many streams may hold a partial
# entry at once (the runtimes write two), how long one waits for its rest (the
# runtimes write the pieces of a line at once), and the longest envelope line
# framed whole (a 16 KiB piece of control characters is 96 KiB escaped).
CONTAINER_SOURCE_KEYS = ("stream",)
CONTAINER_FIELDS = ("stream", "@runtime_time")  # besides message and @timestamp
# The keys of Logstash's (see RESERVED_CHECKS) whose values the container stage
# makes valid itself, and the key it marks with: the encoder splices its events
# (not "@metadata", which --event-id's must merge with).
CONTAINER_CHECKED_KEYS = frozenset(("@timestamp", "tags", "@version", "event", "@json_error",
                                    "@continues"))
CONTAINER_STREAMS = 4
CONTAINER_PARTIAL_QUIET = 1.0
CONTAINER_LINE_BYTES = 128 << 10
# What each endpoint's socket beyond the first holds (measured: 256 receivers
# at full speed, see bench/README.md "Many receivers"): libzmq's pipes (chunks
# of 256 message slots), its monitor's sockets, the connection's buffers.
MEMORY_PER_ENDPOINT = 80 << 10
# What fit_memory lowers an unset --queue-bytes or --replay-bytes to, at most.
FIT_FLOOR_BYTES = 1 << 20
MEMORY_PER_READ_BYTE = 24  # escaping and encoding copies of one read
# --json and --journal: Python's objects of a parsed line take up to this many bytes
# per byte of it (measured: "[{},{},...]" 25, "[[{}]],..." 36, runs of 95 nested
# arrays 48); a run of lines is parsed at a time (JSON_RUN_BYTES), a longer line alone.
MEMORY_PER_PARSED_BYTE = 52

# Counters go to systemd (STATUS=) and to --metrics-file at most this often, and only
# while they change or lines wait for a connected receiver (README "Running as a service");
# the first time after an idle spell at least this long after the line that ended it.
PUBLISH_SECONDS = 2.0
# While nothing changes but lines wait (a receiver that takes none), the looks
# space out, doubling up to this.
PUBLISH_MOST_SECONDS = 60.0
# Watchdog pings at most this often, whatever WATCHDOG_USEC says (systemd counts
# WatchdogSec= in microseconds; a loop timer does not go finer than a millisecond).
MIN_WATCHDOG_SECONDS = 0.01
PUBLISH_FIRST_SECONDS = 0.5
# The placeholder of --metrics-file for zmqpush's process id.
PID_PLACEHOLDER = "{pid}"
# --metrics-listen: /healthz fails once events waited this long with none sent
# (?stall=SECONDS says otherwise); a request must come whole within HTTP_TIMEOUT.
DEFAULT_STALL_SECONDS = 60.0
HTTP_TIMEOUT = 5.0


# ---------------------------------------------------------------- options --
# Owns the command line, its ZMQPUSH_* environment twins and their validation.

def write_stderr(text: str):
    """Write to stderr; never fails (stderr may be a closed pipe)."""
    try:
        os.write(2, text.encode("utf-8", "replace"))
    except OSError:
        pass


def warn(text: str):
    """One diagnostic line on stderr, prefixed "zmqpush: ", and before that
    the time (ISO 8601 UTC, milliseconds) when stderr stamps none itself (see
    stderr_stamps_time)."""
    stamp = "" if stderr_stamps_time() else iso8601_utc(time.time()) + " "
    write_stderr(f"{stamp}zmqpush: {text}\n")


@functools.cache
def stderr_stamps_time() -> bool:
    """Whether what reads stderr stamps each line with its time: a terminal
    (a person watching), or the journal (JOURNAL_STREAM, "DEV:INODE", names
    the stream stderr is, as systemd sets it for a unit's output).  Looked at
    once: stderr is what it was at the first diagnostic."""
    try:
        if os.isatty(2):
            return True
        info = os.fstat(2)
    except OSError:
        return False
    return os.environ.get("JOURNAL_STREAM", "") == f"{info.st_dev}:{info.st_ino}"


ENDPOINT_RE = re.compile(r"^(tcp://(\[[0-9A-Fa-f:.]+\]|[^:/\s\[\]]+):(\d{1,5}|\*)"
                         r"|ipc://\S+)$")
# Bounds that keep every value within what the socket options and the
# allocations take (no OverflowError or MemoryError at run time).
MAX_SECONDS = 86400
MAX_SNDHWM = 2**31 - 1
MAX_BATCH_BYTES = 16 << 20
MIN_MAX_LINE_BYTES = 4  # one UTF-8 character: a cut never falls inside one
HEARTBEAT_RANGE = (1, 3600)

HELP_EPILOG = """\
examples:
  tail -n0 -F /var/log/app.log | zmqpush.py app  # -n0: no old lines again
  seq 1 100 | zmqpush.py -c tcp://logstash.example:2120 --batch test

rsyslog (RainerScript):
  module(load="omprog")
  action(type="omprog" binary="/usr/local/bin/zmqpush.py syslog -c tcp://127.0.0.1:2120"
         template="RSYSLOG_SyslogProtocol23Format" forceSingleInstance="on")
rsyslog (legacy, no arguments: set ZMQPUSH_CONNECT in rsyslog's environment):
  $ModLoad omprog
  $ActionOMProgBinary /usr/local/bin/zmqpush.py
  *.* :omprog:;RSYSLOG_SyslogProtocol23Format

Every option except the four actions (--help, --help-all, --version,
--make-cert) can also be set by an environment variable ZMQPUSH_<OPTION>, and
LOGTYPE by ZMQPUSH_LOGTYPE (e.g. ZMQPUSH_CONNECT, ZMQPUSH_WHEN_FULL; a switch
takes 1 or 0, a repeatable option a comma-separated list); the command line wins.

exit codes:
  0    every line read was handed to ZeroMQ and delivered within --linger
  1    runtime error: the bind or --metrics-listen address is in use, or
       reading or sending failed
       (one line names the cause; what was read is still delivered if it can be)
  2    usage error: bad option, value or endpoint, an argument that is not
       UTF-8, or a --spool directory that cannot be used or is in use
  3    undelivered: at exit some lines were not handed to ZeroMQ, ZeroMQ still
       held messages when --linger ran out, lines were dropped (--when-full
       drop), --linger 0 did not wait for the lines read, or the spool still
       holds lines (the next run on it sends them), or --stdout's reader
       closed it before all was written
  128+N  forced exit by a second SIGINT or SIGTERM (130, 143)
"""


def write_stdout(text: str) -> int:
    """Write text to descriptor 1; the exit code: 0, or 1 if it cannot be
    written (one line on stderr, none when the reader has gone: EPIPE)."""
    data = text.encode()
    try:
        while data:
            data = data[os.write(1, data):]
    except BrokenPipeError:
        return EXIT_ERROR
    except OSError as exc:
        warn(f"cannot write to stdout: {exc.strerror or exc}")
        return EXIT_ERROR
    return EXIT_OK


class UsageError(Exception):
    """A bad option, value or endpoint: reported in one line, exit 2."""


class Config(NamedTuple):
    """Everything the run needs, validated; what goes on the wire is UTF-8 bytes."""

    logtype: bytes
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
    fields: tuple  # (key, value) pairs of UTF-8 bytes
    timestamp: bool
    stats: float | None
    stats_format: str
    progress: bool
    replay_bytes: int
    event_ids: bool
    array_bytes: int
    security: Security | None = None  # CURVE keys and allowlists (README "Security")
    spool: str | None = None  # the spool directory (README "Outages")
    spool_bytes: int = DEFAULT_SPOOL_BYTES
    spool_sync: float = DEFAULT_SPOOL_SYNC  # 0: every write, inf: never
    coalesce: float = DEFAULT_COALESCE  # the read window in seconds; 0 with --confirm
    metrics_file: str | None = None  # --metrics-file PATH, its {pid} not yet replaced
    metrics_name: str = ""  # the "name" label of the metrics
    metrics_listen: tuple | None = None  # (host, port) of --metrics-listen
    multiline: Multiline | None = None  # joining lines into events (README "Multi-line events")
    structured: str | None = None  # "json" or "journal" (README "Structured logs")
    container: str | None = None  # "docker" or "cri" (README "Structured logs")
    json_target: str | None = None
    json_message_key: str | None = None
    json_overwrite: bool = False
    stdout: bool = False  # --stdout: events go to stdout, no socket is opened


class _Parser(argparse.ArgumentParser):
    """argparse's parser that raises UsageError, holds the option table's
    entries it was made from (options) and formats a brief help or the whole."""

    options: tuple = ()

    def error(self, message: str):
        raise UsageError(message)

    def format_help(self, everything: bool = True) -> str:
        """Every option by group, and the epilog; or (everything False) argparse's
        own sections, then in one section the options the table marks common,
        and where the rest is."""
        formatter = self._get_formatter()
        formatter.add_usage(self.usage, self._actions, self._mutually_exclusive_groups)
        formatter.add_text(self.description)
        for title, actions in self._help_sections(everything):
            formatter.start_section(title)
            formatter.add_arguments(actions)
            formatter.end_section()
        formatter.add_text(self.epilog if everything else BRIEF_EPILOG.format(prog=self.prog))
        return formatter.format_help()

    def _help_sections(self, everything: bool) -> list:
        """(title, actions) of each section of the help: argparse's groups; or
        (everything False) those of them that hold options outside the table
        (LOGTYPE, the help), and one of the options the table marks common."""
        if everything:
            return [(group.title, group._group_actions) for group in self._action_groups]
        tabled = {o.dest: o for o in self.options if o.kind != "positional"}
        own = [(group.title, [a for a in group._group_actions if a.dest not in tabled])
               for group in self._action_groups]
        common = [a for a in self._actions if a.dest in tabled and tabled[a.dest].common]
        return [(title, actions) for title, actions in own if actions] + [
            ("the options most users need", common)]


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


def _integer(low: int, high: int | None = None):
    """An argparse type: an integer from low to high (no upper bound if None)."""
    def integer(text: str) -> int:
        value = int(text)
        if value < low or (high is not None and value > high):
            raise ValueError(text)
        return value
    integer.__name__ = (f"integer from {low} to {high}" if high is not None
                        else "positive integer" if low == 1 else f"integer of at least {low}")
    return integer


def _directory(text: str) -> str:
    """An argparse type: a path that is not empty."""
    if not text:
        raise ValueError(text)
    return text


_directory.__name__ = "directory (not empty)"


def _seconds(low: float = 0, high: float = MAX_SECONDS, off: bool = False):
    """An argparse type: seconds from low to high; 0 too when off (it means "off")."""
    def seconds(text: str) -> float:
        value = float(text)
        if not (low <= value <= high or (off and value == 0)):
            raise ValueError(text)
        return value + 0.0  # -0 is 0 (it was printed as "-0s")
    seconds.__name__ = f"number of seconds from {low:g} to {high:g}" + \
        (" (0: off)" if off else "")
    return seconds


def _switch(text: str) -> bool:
    """An on/off environment value; ValueError for anything else (a typo must not
    quietly turn --confirm off under rsyslog)."""
    word = text.strip().lower()
    if word in ("1", "true", "yes", "on"):
        return True
    if word in ("", "0", "false", "no", "off"):
        return False
    raise ValueError(text)


def _buffer_limits(text: str) -> tuple:
    parts = [int(p) for p in text.split(",")]
    if len(parts) > 2 or any(p < 0 for p in parts):
        raise ValueError(text)
    high, low = parts[0], (parts[1] if len(parts) == 2 else None)
    if low is not None and low > high:
        raise ValueError(text)
    return high, low


_buffer_limits.__name__ = "HIGH[,LOW] with HIGH >= LOW >= 0"


def _listen_address(text: str) -> tuple:
    """--metrics-listen: HOST:PORT or [IPV6]:PORT, as (host, port)."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or int(port) > 65535:
        raise ValueError(text)
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, int(port)


_listen_address.__name__ = "HOST:PORT"


def _spool_sync(text: str) -> float:
    """--spool-sync: "write" (0.0), "never" (inf) or seconds between flushes."""
    if text in ("write", "never"):
        return 0.0 if text == "write" else float("inf")
    return _sync_seconds(text)


_sync_seconds = _seconds(0.001, MAX_SECONDS)
_spool_sync.__name__ = '"write", "never" or ' + _sync_seconds.__name__


def _presets(text: str) -> tuple:
    """--multiline: a comma-separated list of MULTILINE_PRESETS."""
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in MULTILINE_PRESETS for n in names):
        raise ValueError(text)
    return names


_presets.__name__ = "comma-separated list of " + ", ".join(MULTILINE_PRESETS)


def _source_keys(text: str) -> tuple:
    """--multiline-source: a comma-separated list of keys, each once."""
    keys = tuple(dict.fromkeys(k.strip() for k in text.split(",") if k.strip()))
    if not keys:
        raise ValueError(text)
    return keys


_source_keys.__name__ = "comma-separated list of keys"


def _pattern(text: str) -> re.Pattern:
    """--multiline-pattern: a Python regular expression, matched on bytes, with
    POSIX bracket classes read as Filebeat's Go regexp reads them ([[:space:]]);
    ValueError if it does not compile or nests repetitions (see nests_repetitions),
    ArgumentTypeError saying what to write where Python would warn of its meaning."""
    source = posix_classes(text.encode("utf-8", "surrogateescape"))
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            pattern = re.compile(source)
        except (re.error, OverflowError):  # OverflowError: a repetition count past 2**32
            raise ValueError(text) from None
    if said:
        raise argparse.ArgumentTypeError(
            f"{text!r}: {said[0].message} (Python may read it otherwise one day: "
            "escape a [ or an operator inside [...] with a backslash)")
    if nests_repetitions(source):
        raise ValueError(text)
    return pattern


# The POSIX classes of Go's regexp (and so Filebeat's patterns), as ranges that
# mean the same inside a Python bracket expression.
POSIX_CLASSES = {
    b"alnum": rb"0-9A-Za-z", b"alpha": rb"A-Za-z", b"ascii": rb"\x00-\x7f",
    b"blank": rb"\t ", b"cntrl": rb"\x00-\x1f\x7f", b"digit": rb"0-9", b"graph": rb"!-~",
    b"lower": rb"a-z", b"print": rb" -~", b"punct": rb"!-/:-@\[-`{-~",
    b"space": rb"\t\n\v\f\r ", b"upper": rb"A-Z", b"word": rb"0-9A-Za-z_",
    b"xdigit": rb"0-9A-Fa-f"}
POSIX_CLASS_RE = re.compile(rb"\[:(\^?)([a-z]+):\]")


def posix_classes(source: bytes) -> bytes:
    """source with each [:name:] inside a bracket expression replaced by its ranges
    (Python's re would read it as a set of characters) and any other [ there
    escaped (a character to Go, a warning to Python); ArgumentTypeError for a name
    Go does not know or a negated class ([:^digit:]), which Python's brackets
    cannot hold."""
    out, pos, bracket = [], 0, False
    while pos < len(source):
        char = source[pos:pos + 1]
        if char == b"\\":
            out.append(source[pos:pos + 2])
            pos += 2
            continue
        if bracket and char == b"[":
            found = POSIX_CLASS_RE.match(source, pos)
            out.append(posix_class(*found.groups()) if found else b"\\[")
            pos = found.end() if found else pos + 1
            continue
        if not bracket and char == b"[":
            start = pos + 1 + (source[pos + 1:pos + 2] == b"^")
            start += source[start:start + 1] == b"]"  # a leading ] is a character
            out.append(source[pos:start])
            pos, bracket = start, True
            continue
        bracket = bracket and char != b"]"
        out.append(char)
        pos += 1
    return b"".join(out)


def posix_class(negated: bytes, name: bytes) -> bytes:
    """The ranges of POSIX class name inside a bracket, or ArgumentTypeError."""
    text = name.decode()
    if negated:
        raise argparse.ArgumentTypeError(
            f"[:^{text}:] (a negated class) has no Python form inside [...]: "
            f"write [^...] with the class's characters")
    if name not in POSIX_CLASSES:
        raise argparse.ArgumentTypeError(
            f"[:{text}:] is not a POSIX class (" + ", ".join(
                n.decode() for n in POSIX_CLASSES) + ")")
    return POSIX_CLASSES[name]


_pattern.__name__ = ("Python regular expression without a repetition or an "
                     "alternation inside a repetition, such as (a+)+ or (a|aa)+")


def nests_repetitions(source: bytes) -> bool:
    """True if the regular expression repeats, more than once, a part that
    holds a repetition or an alternation ((a+)+, (a{1,9}){1,99}, (a|aa)+):
    Python's re may then backtrack for a time exponential in the line's
    length, and no signal is taken meanwhile.  Possessive repetitions and
    atomic groups (Python 3.11+), which never backtrack, are left out."""
    try:
        from re import _parser as parser
    except ImportError:  # CPython before 3.11
        import sre_parse as parser
    return _nests(parser.parse(source), False, parser.SubPattern)


def _nests(parsed, repeated: bool, subpattern: type) -> bool:
    for op, av in parsed:
        name = str(op)
        if name in ("POSSESSIVE_REPEAT", "ATOMIC_GROUP"):
            continue
        if name in ("MAX_REPEAT", "MIN_REPEAT"):
            if repeated and av[1] > 1:
                return True
            if _nests(av[2], repeated or av[1] > 1, subpattern):
                return True
            continue
        if name == "BRANCH" and repeated:
            return True
        for child in _subpatterns(av, subpattern):
            if _nests(child, repeated, subpattern):
                return True
    return False


def _subpatterns(av, subpattern: type) -> list:
    """The parsed subpatterns an item's argument holds (groups, branches)."""
    if isinstance(av, subpattern):
        return [av]
    if isinstance(av, (tuple, list)):
        return [child for part in av for child in _subpatterns(part, subpattern)]
    return []


class Option(NamedTuple):
    """One entry of the option table: it makes the argparse option, its
    ZMQPUSH_* twin, its default for Config and its simple cross-checks.

    kind: "value" (takes one value, parse(text) converts it), "switch" (an
    on/off flag; its twin takes 1/true/yes/on or 0/false/no/off), "list"
    (repeatable; its twin a comma or space separated list), "positional" or
    "exit" (acts and exits, no twin).  needs: groups of options, one of each
    group must be given too ("X needs A or B").  conflicts: (option, why)
    pairs, an option written "--name" or "--name VALUE", that it cannot be
    combined with.  common: --help shows it (--help-all shows every option)."""

    flags: tuple
    help: str
    metavar: str | None = None
    parse: Callable | None = None  # argparse's type: text -> value, ValueError if bad
    choices: tuple | None = None
    kind: str = "value"
    default: object = None  # what the run takes when the option is not given
    needs: tuple = ()
    conflicts: tuple = ()
    common: bool = False

    @property
    def dest(self) -> str:
        """The option's key in the parsed options (argparse's dest)."""
        return option_dest(self.flags[-1])

    @property
    def twin(self) -> str | None:
        """Its environment variable, None for an option that acts and exits."""
        return None if self.kind == "exit" else "ZMQPUSH_" + self.dest.upper()


def option_dest(flag: str) -> str:
    """The dest of a long option (or a positional's name): --max-line-bytes is max_line_bytes."""
    return flag.lstrip("-").replace("-", "_").lower()


MULTILINE_NEEDED = ("--multiline", "--multiline-pattern")
# What only a ZeroMQ socket uses: --stdout refuses them.
SOCKET_OPTIONS = ("--connect", "--bind", "--heartbeat", "--replay-bytes", "--sndhwm",
                  "--write-buffer-limits", "--curve-server-cert", "--curve-cert",
                  "--curve-clients", "--allow")
STDOUT_CONFLICTS = (*((spec, "--stdout opens no socket") for spec in SOCKET_OPTIONS),
                    ("--confirm", "its stdout carries rsyslog's replies"),
                    ("--spool", "nothing to keep lines for: stdout takes them or ends the run"))

def replayable_array_bytes(replay_bytes: int) -> int:
    """--batch: the largest array message such that a replay window of
    replay_bytes covers a stock receiver's RCVHWM of them plus the kernels'
    buffers and our ZeroMQ queue (no cap when replay is off; 4 KiB at least)."""
    if not replay_bytes:
        return 1 << 62
    room = replay_bytes - RECEIVER_KERNEL_BYTES - REPLAY_SNDBUF - REPLAY_BATCH_ZMQ_BYTES
    return max(4096, room // STOCK_RCVHWM)


# The options, grouped by concern as --help-all shows them (README "Usage").
OPTION_GROUPS = (
    ("connection", (
        Option(("-c", "--connect"), kind="list", metavar="ENDPOINT", common=True,
               help="connect to ENDPOINT (repeatable: round-robin over all); "
               f"default {DEFAULT_ENDPOINT}"),
        Option(("--bind",), kind="list", metavar="ENDPOINT", common=True,
               help='bind ENDPOINT instead (Logstash input mode => "client")'),
        Option(("--stdout",), kind="switch", common=True,
               conflicts=STDOUT_CONFLICTS,
               help="write every event that would be sent to stdout instead, one JSON "
               "document a line (--batch: its arrays), and open no socket"),
        Option(("--heartbeat",), parse=_seconds(*HEARTBEAT_RANGE, off=True),
               metavar="SECONDS",
               help="ZeroMQ heartbeat interval, 1 to 3600; a peer silent for 3 "
               "intervals is dropped and reconnected (default 0: off)"),
    )),
    ("delivery and flow control", (
        Option(("--linger",), parse=_seconds(), metavar="SECONDS", default=DEFAULT_LINGER,
               common=True,
               help="at end of input, wait at most this long for delivery; 0: do "
               "not wait (exit 3 if anything was read) (default "
               f"{DEFAULT_LINGER:g}, below rsyslog's closeTimeout of 5; at most "
               f"{MAX_SECONDS})"),
        Option(("--replay-bytes",), parse=_integer(0), metavar="N",
               help="replay window: after a receiver goes away, send again what "
               "may have been in flight to it, up to N bytes of the newest "
               f"messages (default {DEFAULT_REPLAY_BYTES}; 0: off, at most once)"),
        Option(("--queue-bytes",), parse=_integer(1), metavar="N",
               default=DEFAULT_QUEUE_BYTES,
               help="bound of the queue between reader and sender, in bytes of "
               f"encoded JSON (default {DEFAULT_QUEUE_BYTES})"),
        Option(("--when-full",), choices=("block", "drop"), default="block",
               help="queue full: block the producer (default) or drop, count and "
               "exit 3; only for inputs that can be polled (pipes, sockets, terminals)"),
        Option(("--memory-bytes",), parse=_integer(1), metavar="N",
               default=DEFAULT_MEMORY_BYTES,
               help="refuse settings whose worst-case memory (queue, replay window, "
               "ZeroMQ, line and read sizes: README formula) exceeds N (default "
               f"{DEFAULT_MEMORY_BYTES})"),
        Option(("--sndhwm",), parse=_integer(1, MAX_SNDHWM), metavar="N",
               help="ZeroMQ send high-water mark in messages per receiver (default "
               f"{DEFAULT_SNDHWM}; in default mode ZeroMQ also holds at most about "
               f"{PIPE_BYTES >> 20} MiB; with --batch, derived from the array size; "
               f"with --confirm, a --confirm-timeout over 0 and no --spool, "
               f"{CONFIRM_SNDHWM})"),
        Option(("--write-buffer-limits",), parse=_buffer_limits, metavar="HIGH[,LOW]",
               default=DEFAULT_WRITE_LIMITS,
               help="aiozmq transport watermarks in bytes (default "
               f"{DEFAULT_WRITE_LIMITS[0]},{DEFAULT_WRITE_LIMITS[1]}; "
               "LOW left out: HIGH/4)"),
    )),
    ("input handling", (
        Option(("--max-line-bytes",), parse=_integer(MIN_MAX_LINE_BYTES), metavar="N",
               default=DEFAULT_MAX_LINE_BYTES,
               help="longer lines are split into messages marked "
               f'"@continues":true (at least {MIN_MAX_LINE_BYTES}, '
               f"default {DEFAULT_MAX_LINE_BYTES})"),
        Option(("--batch",), kind="switch",
               help="send the lines of each read as JSON arrays, one per message"),
        Option(("--batch-bytes",), parse=_integer(1, MAX_BATCH_BYTES), metavar="N",
               default=DEFAULT_READ_BYTES,
               help=f"--batch: bytes read at a time (default {DEFAULT_READ_BYTES}, at "
               f"most {MAX_BATCH_BYTES}); an array is at most N bytes and, while the "
               "replay window is on, small enough that the window can resend the "
               f"1000 a receiver may hold ({replayable_array_bytes(DEFAULT_REPLAY_BYTES)}"
               " bytes at the default --replay-bytes)"),
        Option(("--coalesce",), parse=_seconds(0, MAX_COALESCE), metavar="SECONDS",
               default=DEFAULT_COALESCE,
               help="while lines keep coming, read at most once per SECONDS, taking "
               "all that came meanwhile in one read; a line after a quiet spell is "
               f"read at once (default {DEFAULT_COALESCE:g}; 0: read at every line; "
               f"at most {MAX_COALESCE:g}; --confirm: always 0)"),
    )),
    ("fields", (
        Option(("--host-field",), kind="switch", common=True,
               conflicts=(("--host-field-ecs", "one key for the host: \"host\" or ECS's"),),
               help='add "host": this host\'s name (Logstash would stamp its own)'),
        Option(("--host-field-ecs",), kind="switch",
               help='add "host":{"name": this host\'s name}, the form ECS '
               "mappings (Logstash 8+ with Elasticsearch) accept"),
        Option(("--timestamp",), kind="switch", common=True,
               help='add "@timestamp": when the line was read, ISO 8601 UTC, ms'),
        Option(("-f", "--field"), kind="list", metavar="KEY=VALUE", default=(), common=True,
               help="add a static string field (repeatable)"),
        Option(("--event-id",), kind="switch",
               help='add "@metadata":{"_id":"RUN-SEQ"} to each event, the same in '
               "a replayed copy (Logstash: document_id => \"%%{[@metadata][_id]}\")"),
    )),
    ("structured logs", (
        Option(("--json",), kind="switch", common=True,
               conflicts=(("--journal", "--journal parses JSON"),),
               help="a line that is a JSON object is merged into the event; any other "
               'line is sent as text with "@json_error" and the tag _jsonparsefailure'),
        Option(("--json-target",), metavar="KEY", needs=(("--json",),),
               help="--json: put the object's fields under KEY, not at the root"),
        Option(("--json-message-key",), metavar="KEY", needs=(("--json",),),
               help='--json: the string value of KEY becomes "message"'),
        Option(("--json-overwrite",), kind="switch", needs=(("--json",),),
               help="--json: the line's keys win over zmqpush's own (type, @pid, host, "
               "-f fields, @metadata._id); without it the line's values they replace "
               "are kept under @json_replaced"),
        Option(("--journal",), kind="switch", common=True,
               help="lines are `journalctl -o json --all` entries: MESSAGE, the time, "
               "priority, identifier, unit, pid and host become fields, __CURSOR the "
               "event id"),
        Option(("--docker",), kind="switch",
               conflicts=(("--cri", "one input format"), ("--journal", "one input format"),
                          ("--timestamp", "the runtime's time is the event's")),
               help="lines are Docker json-file entries: \"log\" becomes \"message\" "
               "(a piece of a long line joined to the rest), \"stream\" a field, "
               "\"time\" \"@timestamp\"; --json on top merges the app's JSON"),
        Option(("--cri",), kind="switch",
               conflicts=(("--journal", "one input format"),
                          ("--timestamp", "the runtime's time is the event's")),
               help="lines are CRI log lines (containerd, CRI-O: TIME STREAM P|F "
               "MESSAGE): as --docker, partial (P) pieces joined to their F"),
    )),
    ("reporting", (
        Option(("--stats",), parse=_seconds(0.1, MAX_SECONDS, off=True), metavar="SECONDS",
               common=True,
               help=f"print the counters on stderr every SECONDS (0.1 to {MAX_SECONDS})"),
        Option(("--stats-format",), choices=("text", "json"), default="text",
               help="--stats and SIGUSR1 line format (default text)"),
        Option(("--progress",), kind="switch",
               help="a self-updating status line, only when stderr is a terminal"),
        Option(("-q", "--quiet"), kind="switch", common=True,
               help="no connection events; errors, the closing line and what "
               "you asked for (--stats, SIGUSR1) still print"),
        Option(("--metrics-file",), parse=_directory, metavar="PATH",
               help="write the counters to PATH in the Prometheus text format "
               "(node_exporter's textfile collector), at most every "
               f"{PUBLISH_SECONDS:g} s while they change; removed at exit 0; "
               f"{PID_PLACEHOLDER} in PATH: the process id (also a label then)"),
        Option(("--metrics-listen",), parse=_listen_address, metavar="HOST:PORT",
               help="serve GET /metrics (the same text) and GET /healthz (503 once "
               f"events waited {DEFAULT_STALL_SECONDS:g} s, or ?stall=SECONDS, with "
               "none sent) over HTTP on HOST:PORT"),
        Option(("--metrics-name",), metavar="NAME", default="",
               help='the "name" label of every metric (default: none)'),
    )),
    ("rsyslog omprog", (
        Option(("--confirm",), kind="switch", common=True,
               conflicts=(("--batch", "rsyslog writes a line only once the last is "
                                      "answered: every array would hold one line"),
                          ("--when-full drop", "every line read needs a reply")),
               help='omprog confirmMessages mode: print "OK" when ready, '
               "then one reply line per line read"),
        Option(("--confirm-timeout",), parse=_seconds(), metavar="SECONDS",
               default=DEFAULT_CONFIRM_TIMEOUT,
               help="--confirm: how long a line may wait for ZeroMQ before it is "
               f"refused; 0: only what ZeroMQ takes at once "
               f"(default {DEFAULT_CONFIRM_TIMEOUT:g})"),
    )),
    ("security", (  # checked together in security_from
        Option(("--curve-server-cert",), metavar="FILE",
               help="encrypt with CURVE and authenticate the receiver: its public "
               "certificate (ZPL, as czmq and pyzmq write it); with --connect"),
        Option(("--curve-cert",), metavar="FILE",
               help="our own CURVE key pair: a certificate with its secret key "
               "(FILE, or FILE_secret as czmq's zcert_load finds it); connecting: "
               "the client's (left out: a new key pair each run), binding: the server's"),
        Option(("--curve-clients",), metavar="DIR",
               help="--bind with --curve-cert: admit only clients whose public "
               "certificate is in DIR (czmq's clientcertpath); others are refused "
               "and counted"),
        Option(("--allow",), kind="list", metavar="CIDR",
               help="--bind: admit peers only from these addresses (repeatable, e.g. "
               "10.0.0.0/8 or 192.0.2.7); others are refused and counted"),
        Option(("--make-cert",), kind="exit", metavar="PATH",
               help="write a new key pair to PATH.key (public) and PATH.key_secret "
               "(mode 600), print the public key, and exit (no environment twin)"),
    )),
    ("disk spool", (
        Option(("--spool",), parse=_directory, metavar="DIR", common=True,
               help="keep every line read in a disk spool in DIR (created if "
               "missing) until it is sent: input never waits for a receiver "
               "while the spool has room, and a new run on DIR sends what a "
               "crashed or stopped one left, first (README \"Outages\")"),
        Option(("--spool-bytes",), parse=_integer(MIN_SPOOL_BYTES, MAX_SPOOL_BYTES),
               metavar="N", default=DEFAULT_SPOOL_BYTES,
               help="most disk the spool uses; when it is full, --when-full "
               f"applies (default {DEFAULT_SPOOL_BYTES}, at least {MIN_SPOOL_BYTES})"),
        Option(("--spool-sync",), parse=_spool_sync, metavar="WHEN",
               default=DEFAULT_SPOOL_SYNC,
               help='flush the spool to the disk after every "write", every '
               'SECONDS, or "never" (the OS decides); every choice survives a '
               "crash of zmqpush, power loss loses at most what was not flushed "
               f"(default {DEFAULT_SPOOL_SYNC:g})"),
    )),
    ("multi-line events", (
        Option(("--multiline",), parse=_presets, metavar="PRESETS", default=(), common=True,
               conflicts=(("--multiline-pattern", "one joining rule: presets or a pattern"),),
               help="join each stack trace's lines into one event: a comma-separated "
               f"list of {', '.join(MULTILINE_PRESETS)} (README \"Multi-line events\")"),
        Option(("--multiline-pattern",), parse=_pattern, metavar="RE",
               help="join lines by a Python regular expression instead (Filebeat's "
               "rule): a line it matches (in its first "
               f"{MULTILINE_MATCH_BYTES} bytes) continues the event before it"),
        Option(("--multiline-negate",), kind="switch", needs=(("--multiline-pattern",),),
               help="--multiline-pattern: a line it does NOT match continues"),
        Option(("--multiline-match",), choices=("after", "before"), default="after",
               needs=(("--multiline-pattern",),),
               help="--multiline-pattern: continuing lines join the event before "
               "them (after, default) or the line after them (before)"),
        Option(("--multiline-max-lines",), parse=_integer(2), metavar="N",
               default=DEFAULT_MULTILINE_MAX_LINES, needs=(MULTILINE_NEEDED,),
               help="an event of more lines is cut, its first part marked "
               f'"@continues":true (default {DEFAULT_MULTILINE_MAX_LINES})'),
        Option(("--multiline-max-bytes",), parse=_integer(MIN_MAX_LINE_BYTES), metavar="N",
               needs=(MULTILINE_NEEDED,),
               help="an event of more bytes is cut alike (default and at most "
               "--max-line-bytes)"),
        Option(("--multiline-timeout",), parse=_seconds(0.01, MAX_SECONDS), metavar="SECONDS",
               default=DEFAULT_MULTILINE_TIMEOUT, needs=(MULTILINE_NEEDED,),
               help="send an unfinished event after SECONDS without a new line "
               f"(default {DEFAULT_MULTILINE_TIMEOUT:g})"),
        Option(("--multiline-source",), parse=_source_keys, metavar="KEY[,KEY...]",
               needs=(MULTILINE_NEEDED, ("--json", "--journal", "--docker", "--cri")),
               help="--json, --journal, --docker, --cri: join only lines whose KEYs "
               "have the same values (default --journal: " + ",".join(JOURNAL_SOURCE_KEYS)
               + "; --docker, --cri: stream; --json: all objects one source)"),
    )),
)


LOGTYPE = Option(("logtype",), kind="positional", metavar="LOGTYPE", default="syslog",
                 common=True, help='the "type" field (default: syslog)')
OPTIONS = (LOGTYPE, *(option for _, options in OPTION_GROUPS for option in options))

DESCRIPTION = """\
Read lines on stdin and push each as JSON
{"message":LINE,"type":LOGTYPE,"@pid":PID} over a ZeroMQ PUSH socket
to a Logstash zeromq input (or with --stdout, to stdout). Diagnostics
go to stderr; stdout is used only by --confirm and --stdout."""

BRIEF_EPILOG = """\
examples:
  tail -n0 -F /var/log/app.log | zmqpush.py app  # -n0: no old lines again
  seq 1 100 | zmqpush.py -c tcp://logstash.example:2120 test

Every option, its ZMQPUSH_* environment variable, rsyslog's configuration
and the exit codes: {prog} --help-all (README "Usage")."""


class _HelpAction(argparse.Action):
    """-h/--help: the usage, the options most users need and where the rest
    is; --help-all (everything=True): every option, examples and exit codes."""

    def __init__(self, option_strings, dest, everything: bool = False, help=None):
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS,
                         nargs=0, help=help)
        self.everything = everything

    def __call__(self, parser, namespace, values, option_string=None):
        parser.exit(write_stdout(parser.format_help(everything=self.everything)))


def build_parser(prog: str = "zmqpush.py", structured: bool = True) -> argparse.ArgumentParser:
    """The CLI made from the option table, its options grouped by concern;
    shared with zmqpush-watermark.py, which leaves out the structured logs
    options (its own --json is its output) and --stdout (it measures a
    socket).  The parser's `options` are the table entries it holds."""
    p = _Parser(prog=prog, usage=f"{prog} [OPTION...] [LOGTYPE]", description=DESCRIPTION,
                epilog=HELP_EPILOG, formatter_class=_HelpFormatter, add_help=False)
    p.add_argument("-h", "--help", action=_HelpAction,
                   help="show the options most users need and exit")
    p.add_argument("--help-all", action=_HelpAction, everything=True,
                   help="show every option, examples and exit codes, and exit")
    p.add_argument("--version", action="version", version=f"zmqpush {__version__}")
    _add_option(p, LOGTYPE)
    p.options = (LOGTYPE,)
    for title, options in OPTION_GROUPS:
        if structured or title != "structured logs":
            group = p.add_argument_group(title)
            kept = tuple(o for o in options if structured or o.dest != "stdout")
            for option in kept:
                _add_option(group, option)
            p.options += kept
    return p


def _add_option(group, option: Option):
    """option as an argparse argument of group (a parser or one of its groups)."""
    if option.kind == "positional":
        group.add_argument(option.dest, nargs="?", metavar=option.metavar, help=option.help)
    elif option.kind == "switch":
        group.add_argument(*option.flags, action="store_true", default=None, help=option.help)
    elif option.kind == "exit":  # --make-cert, the one option that acts and exits
        group.add_argument(*option.flags, action=_MakeCertAction, metavar=option.metavar,
                           help=option.help)
    else:
        group.add_argument(*option.flags, action="append" if option.kind == "list" else "store",
                           type=option.parse, choices=option.choices, metavar=option.metavar,
                           help=option.help)


def given_options(parser: argparse.ArgumentParser, args: argparse.Namespace,
                  environ) -> dict:
    """Each table option of the parser (by dest) as the command line gave it,
    else as its ZMQPUSH_* twin in environ did, else None."""
    given = {}
    for option in parser.options:
        if option.twin is not None:
            value = getattr(args, option.dest)
            given[option.dest] = value if value is not None else twin_value(option, environ)
    return given


def twin_value(option: Option, environ):
    """The value of option's ZMQPUSH_* twin in environ, converted as the option
    would convert it, or None if it is not set.  UsageError, naming the
    variable, if the value is not UTF-8 or not valid."""
    name = option.twin
    text = environ.get(name)
    if text is None:
        return None
    utf8(text, name)
    try:
        if option.kind == "switch":
            value = _switch(text)
        elif option.kind == "list":
            value = [v for v in re.split(r"[\s,]+", text) if v]
        else:
            value = option.parse(text) if option.parse else text
    except ValueError:
        expected = getattr(option.parse, "__name__", "")
        raise UsageError(f"{name}: invalid value {text!r}"
                         + (f" (expected {expected})" if expected else "")) from None
    if option.choices and value not in option.choices:
        raise UsageError(f"{name}: {text!r} is not one of {', '.join(option.choices)}")
    return value


def _is_given(value) -> bool:
    """True for an option's value that was given: set, and not a switch set off."""
    return value is not None and value is not False


def _given_as(opt: dict, spec: str) -> bool:
    """True if the option of spec ("--name" or "--name VALUE") was given (with VALUE)."""
    flag, _, wanted = spec.partition(" ")
    value = opt.get(option_dest(flag))
    return _is_given(value) and (not wanted or value == wanted)


def check_combinations(options: tuple, opt: dict):
    """UsageError for the first given option, in table order, without one of
    each group of options it needs, or with an option it cannot be combined
    with (the table's needs and conflicts)."""
    for option in options:
        if not _is_given(opt.get(option.dest)):
            continue
        name = option.flags[-1]
        for alternatives in option.needs:
            if not any(_given_as(opt, spec) for spec in alternatives):
                raise UsageError(f"{name} needs {' or '.join(alternatives)}")
        for spec, why in option.conflicts:
            if _given_as(opt, spec):
                raise UsageError(f"{name} and {spec} cannot be combined"
                                 + (f" ({why})" if why else ""))


def with_defaults(options: tuple, opt: dict) -> dict:
    """opt with every option not given set to its table default (off for a switch)."""
    return {option.dest: opt[option.dest] if opt[option.dest] is not None
            else False if option.kind == "switch" else option.default
            for option in options if option.dest in opt}


class Multiline(NamedTuple):
    """How lines are joined into events: presets, or a pattern with Filebeat's
    negate and match; the caps and the quiet timeout."""

    presets: tuple
    pattern: re.Pattern | None
    negate: bool
    after: bool  # --multiline-match after
    max_lines: int
    max_bytes: int
    timeout: float
    sources: tuple | None = None  # --json, --journal: the keys that tell sources apart


def multiline_from(opt: dict, max_line_bytes: int) -> Multiline | None:
    """The --multiline* options (opt: with the table's defaults, its needs and
    conflicts checked), or None when neither --multiline nor
    --multiline-pattern is given.  UsageError for a cap over --max-line-bytes
    and a key that is not UTF-8 (README "Multi-line events").  sources is None
    for lines joined as they come, else the keys of --multiline-source or
    their default."""
    if not opt["multiline"] and opt["multiline_pattern"] is None:
        return None
    max_bytes = opt["multiline_max_bytes"] or max_line_bytes
    if max_bytes > max_line_bytes:
        raise UsageError(f"--multiline-max-bytes {max_bytes} is over --max-line-bytes "
                         f"{max_line_bytes}: raise --max-line-bytes too")
    structured = bool(opt.get("json") or opt.get("journal") or opt.get("docker")
                      or opt.get("cri"))
    for key in opt["multiline_source"] or ():
        utf8(key, "--multiline-source")
    return Multiline(
        presets=opt["multiline"], pattern=opt["multiline_pattern"],
        negate=opt["multiline_negate"], after=opt["multiline_match"] != "before",
        max_lines=opt["multiline_max_lines"],
        max_bytes=max_bytes,
        timeout=opt["multiline_timeout"],
        sources=None if not structured else opt["multiline_source"] or (
            JOURNAL_SOURCE_KEYS if opt.get("journal")
            else CONTAINER_SOURCE_KEYS if opt.get("docker") or opt.get("cri") else ()))


# Keys zmqpush writes itself, or that Logstash gives a meaning: "@metadata" must
# be an object and "event" (ECS v8: [event][original]) too, or the whole frame
# becomes one _jsonparsefailure event; "tags" is Logstash's list and "@version" its
# own; "host" belongs to --host-field and --host-field-ecs (README "Logstash");
# "@json_error" marks what --json and --journal could not merge or had to fix.
RESERVED_FIELDS = ("message", "type", "@pid", "@continues", "@timestamp",
                   "@metadata", "@version", "event", "tags", "host", "@json_error",
                   "@json_replaced")


def utf8(text: str, what: str) -> bytes:
    """text as UTF-8 bytes.  UsageError if it is not valid UTF-8: Python hands
    such bytes of argv and environ over as surrogate escapes, and they could
    never be sent as valid JSON."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError:
        raise UsageError(f"{what} is not valid UTF-8: {text!a}") from None


def extra_fields(specs: list, host_field: bool, host_field_ecs: bool = False) -> tuple:
    """(key, value) pairs from --host-field or --host-field-ecs, then -f KEY=VALUE,
    as UTF-8 bytes; a value is a string, or {b"name": hostname} for
    --host-field-ecs (the option table refuses both).  UsageError if a spec has
    no "=", is not valid UTF-8, or its key is refused by check_field_key."""
    fields = []
    if host_field or host_field_ecs:
        name = utf8(socket.gethostname(), "this host's name")
        fields.append((b"host", {b"name": name} if host_field_ecs else name))
    for spec in specs:
        key, sep, value = spec.partition("=")
        if not sep or not key:
            raise UsageError(f"bad field {spec!a} (expected KEY=VALUE)")
        check_field_key(key, fields)
        fields.append((utf8(key, "field name"), utf8(value, f"field {key!a}")))
    return tuple(fields)


def check_field_key(key: str, fields: list):
    """UsageError if key is reserved, holds "[" or "]" (the Logstash Event keeps
    such a key as it is, but no field reference can name it), or is in fields."""
    if key in RESERVED_FIELDS:
        raise UsageError(f"field {key!r} is reserved (reserved: {', '.join(RESERVED_FIELDS)})")
    if "[" in key or "]" in key:
        raise UsageError(f"field {key!r} holds [ or ]: no Logstash field reference "
                         "can name it")
    if any(key.encode("utf-8", "surrogateescape") == other for other, _ in fields):
        raise UsageError(f"field {key!r} given twice")


def check_endpoint(endpoint: str, connecting: bool = False) -> str:
    """Return endpoint if it is well formed, valid UTF-8 and can reach another
    process (and, to connect to, names a port), else raise UsageError."""
    utf8(endpoint, "endpoint")
    if endpoint.startswith("inproc://"):
        raise UsageError(f"endpoint {endpoint!r}: inproc:// cannot reach another process")
    match = ENDPOINT_RE.match(endpoint)
    port = endpoint.rsplit(":", 1)[-1]
    if not match or (endpoint.startswith("tcp://") and port != "*" and int(port) > 65535):
        raise UsageError(f"bad endpoint {endpoint!r} (expected e.g. tcp://HOST:PORT, "
                         "ipc://PATH)")
    if connecting and endpoint.startswith("tcp://") and port in ("*", "0"):
        raise UsageError(f"cannot connect to {endpoint!r}: a port is needed")
    return endpoint


def help_for(message: str) -> str:
    """Which help describes what a usage error message names: "--help-all"
    when it names an option (or its ZMQPUSH_* twin) that only --help-all
    lists, else "--help"."""
    named = set(re.findall(r"--[a-z][a-z0-9-]*|ZMQPUSH_[A-Z0-9_]+", message))
    rare = {name for o in OPTIONS if not o.common for name in (*o.flags, o.twin)}
    return "--help-all" if named & rare else "--help"


def parse_options(argv=None, environ=None) -> Config:
    """Parse argv (default sys.argv[1:]) and environ into a Config; UsageError if bad."""
    parser = build_parser()
    return config_from_args(parser, parser.parse_args(argv), environ)


def config_from_args(parser: argparse.ArgumentParser, args: argparse.Namespace,
                     environ=None) -> Config:
    """Merge parsed args over ZMQPUSH_* variables and validate; UsageError if bad.
    opt holds what was given (None: not given, which fit_memory and
    security_from tell apart from a value), setting the same with the table's
    defaults."""
    opt = given_options(parser, args, os.environ if environ is None else environ)
    connect = [check_endpoint(e, connecting=True) for e in opt["connect"] or []]
    bind = [check_endpoint(e) for e in opt["bind"] or []]
    check_combinations(parser.options, opt)
    if not connect and not bind and not opt.get("stdout"):
        connect = [DEFAULT_ENDPOINT]
    setting = with_defaults(parser.options, opt)
    high, low = setting["write_buffer_limits"]
    batch_bytes = setting["batch_bytes"]
    spool_bytes = setting["spool_bytes"]
    replay_bytes = replay_default(opt, spool_bytes)
    zmq_bytes = REPLAY_BATCH_ZMQ_BYTES if replay_bytes else BATCH_ZMQ_BYTES
    queue_bytes = setting["queue_bytes"]
    max_line_bytes = setting["max_line_bytes"]
    multiline = multiline_from(setting, max_line_bytes)
    short = None if opt.get("stdout") else descriptor_shortfall(len(connect), len(bind))
    if short is not None:
        raise UsageError(short)
    queue_bytes, held_replay = fit_memory(
        opt, queue_bytes, 0 if opt["spool"] else replay_bytes,
        zmq_bytes=zmq_queue_bytes(bool(opt["batch"]), bool(replay_bytes)),
        max_line_bytes=max_line_bytes,
        read_bytes=batch_bytes if opt["batch"] else DEFAULT_READ_BYTES,
        parses=bool(opt.get("json") or opt.get("journal") or opt.get("docker")
                    or opt.get("cri")),
        joining_bytes=(MEMORY_PER_HELD_BYTE * MULTILINE_SOURCE_BYTES
                       if multiline is not None and multiline.sources is not None else 0))
    if not opt["spool"]:
        replay_bytes = held_replay
    # A spool's larger window is there to cover larger kernel buffers, not larger
    # arrays: a receiver holding RCVHWM large arrays outlasts zmqpush's exit.
    array_bytes = min(batch_bytes, replayable_array_bytes(
        min(replay_bytes, DEFAULT_REPLAY_BYTES) if opt["spool"] else replay_bytes))
    default_sndhwm = (batch_sndhwm(zmq_bytes, array_bytes, max_line_bytes) if opt["batch"]
                      else CONFIRM_SNDHWM if opt["confirm"] and not opt["spool"]
                      and opt["confirm_timeout"] != 0 else DEFAULT_SNDHWM)
    return Config(
        logtype=utf8(setting["logtype"], "LOGTYPE"),
        connect=connect, bind=bind,
        linger=setting["linger"],
        sndhwm=opt["sndhwm"] or default_sndhwm,
        write_high=high, write_low=low,
        queue_bytes=queue_bytes,
        max_line_bytes=max_line_bytes,
        batch=setting["batch"],
        batch_bytes=batch_bytes,
        when_full=setting["when_full"],
        heartbeat=setting["heartbeat"] or None,
        confirm=setting["confirm"],
        confirm_timeout=setting["confirm_timeout"],
        quiet=setting["quiet"],
        fields=extra_fields(setting["field"], setting["host_field"], setting["host_field_ecs"]),
        timestamp=setting["timestamp"],
        stats=setting["stats"] or None,
        stats_format=setting["stats_format"],
        progress=setting["progress"],
        replay_bytes=replay_bytes,
        event_ids=setting["event_id"],
        array_bytes=array_bytes,
        security=security_from(opt, connect, bind),
        spool=setting["spool"],
        spool_bytes=spool_bytes,
        spool_sync=setting["spool_sync"],
        coalesce=0.0 if setting["confirm"] else setting["coalesce"],
        metrics_file=check_metrics_file(setting["metrics_file"]),
        metrics_name=utf8(setting["metrics_name"], "--metrics-name").decode("utf-8"),
        metrics_listen=setting["metrics_listen"],
        multiline=multiline,
        stdout=setting.get("stdout", False),
        **structured_options(setting),
    )


def metrics_path(path: str, pid: int) -> str:
    """--metrics-file PATH with its {pid} placeholders replaced by pid."""
    return path.replace(PID_PLACEHOLDER, str(pid))


def check_metrics_file(path: str | None) -> str | None:
    """path if it names a .prom file (what node_exporter's textfile collector
    reads) in a directory that exists, and nothing but a regular file is there
    now: zmqpush replaces and removes the file, never a link, device or pipe
    someone else put there.  Else UsageError."""
    if path is None:
        return None
    utf8(path, "--metrics-file")
    directory = os.path.dirname(path) or "."
    if not os.path.isdir(directory):
        raise UsageError(f"--metrics-file {path!r}: no directory {directory!r}")
    if not os.path.basename(path):
        raise UsageError(f"--metrics-file {path!r} names a directory, not a file")
    if not path.endswith(".prom"):
        raise UsageError(f"--metrics-file {path!r}: the name must end in .prom "
                         "(node_exporter's textfile collector reads only those)")
    try:
        mode = os.lstat(metrics_path(path, os.getpid())).st_mode
    except FileNotFoundError:
        return path
    except OSError as exc:
        raise UsageError(f"--metrics-file {path!r}: {exc.strerror}") from exc
    if not stat.S_ISREG(mode):
        raise UsageError(f"--metrics-file {path!r} is there and not a regular file "
                         "(zmqpush replaces and removes its file)")
    return path


def structured_options(opt: dict) -> dict:
    """The Config fields of --json, --journal and their options (opt: with the
    table's defaults, its needs and conflicts checked); UsageError if a key
    cannot be used."""
    if "journal" not in opt:  # a parser without these options (zmqpush-watermark.py)
        return {}
    structured = "journal" if opt["journal"] else "json" if opt["json"] else None
    target = opt["json_target"]
    if target is not None:
        if not target or target in RESERVED_FIELDS or target in (
                spec.partition("=")[0] for spec in opt["field"]):
            raise UsageError(f"--json-target {target!r}: give a key no -f field uses "
                             "and zmqpush does not write")
        check_field_key(target, [])
        utf8(target, "--json-target")
    key = opt["json_message_key"]
    if key is not None and (not key or key == "message"):
        raise UsageError("--json-message-key: give the key whose value becomes \"message\"")
    if key is not None:
        utf8(key, "--json-message-key")
    container = "docker" if opt["docker"] else "cri" if opt["cri"] else None
    for spec in opt["field"] if container else ():
        if spec.partition("=")[0] in CONTAINER_FIELDS:
            raise UsageError(f"field {spec.partition('=')[0]!r}: --{container} writes it")
    return {"structured": structured, "container": container, "json_target": target,
            "json_message_key": key, "json_overwrite": opt["json_overwrite"]}


def replay_default(opt: dict, spool_bytes: int) -> int:
    """--replay-bytes as given, else its default: in memory DEFAULT_REPLAY_BYTES;
    with a spool, where the window is on disk, SPOOL_REPLAY_BYTES (at most a
    quarter of the spool, so that the window alone never fills it)."""
    if opt["replay_bytes"] is not None:
        return opt["replay_bytes"]
    if opt["spool"]:
        return min(SPOOL_REPLAY_BYTES, spool_bytes // 4)
    return DEFAULT_REPLAY_BYTES


def memory_need(held: int, max_line_bytes: int, read_bytes: int,
                parses: bool = False, endpoints: int = 1) -> int:
    """The worst case, in bytes, of settings whose queue, window and ZeroMQ hold
    `held` bytes: the base (with one endpoint), plus per byte of the longest
    line piece and of one read what escaping and encoding may take, with
    parses (--json, --journal) the objects of the largest run of lines parsed
    at once, and what each further endpoint's socket holds
    (README "Flow control and memory")."""
    parsed = MEMORY_PER_PARSED_BYTE * (max_line_bytes + JSON_RUN_BYTES) if parses else 0
    return (MEMORY_BASE + held + MEMORY_PER_LINE_BYTE * max_line_bytes
            + MEMORY_PER_READ_BYTE * read_bytes + parsed
            + MEMORY_PER_ENDPOINT * (endpoints - 1))


def fit_memory(opt: dict, queue_bytes: int, replay_bytes: int, *, zmq_bytes: int,
               max_line_bytes: int, read_bytes: int, parses: bool = False,
               joining_bytes: int = 0) -> tuple:
    """(queue bytes, replay bytes) whose worst case fits --memory-bytes, with
    parses as memory_need takes it, joining_bytes for what joining per source
    holds (see ObjectView) and a socket for each -c endpoint (one for all
    --bind ones).

    Settings that fit come back as they are.  Otherwise what the user did not
    set (opt[...] is None) is lowered: first the queue, then the replay window,
    each to FIT_FLOOR_BYTES at least (the window is never turned off), and one
    line on stderr says so.  UsageError if even that does not fit: what the
    user asked for cannot be had within --memory-bytes."""
    limit = opt["memory_bytes"] or DEFAULT_MEMORY_BYTES
    endpoints = max(1, len(opt["connect"] or []) + bool(opt["bind"]))
    excess = memory_need(queue_bytes + replay_bytes + zmq_bytes + joining_bytes,
                         max_line_bytes, read_bytes, parses, endpoints) - limit
    if excess <= 0:
        return queue_bytes, replay_bytes
    fitted = {"queue_bytes": queue_bytes, "replay_bytes": replay_bytes}
    lowered = []
    for name, value in fitted.items():
        if opt[name] is None and excess > 0 and value > FIT_FLOOR_BYTES:
            cut = min(excess, value - FIT_FLOOR_BYTES)
            fitted[name] = value - cut
            excess -= cut
            lowered.append(f"--{name.replace('_', '-')} {value - cut}")
    if excess > 0:
        need = (limit + excess) / (1 << 20)
        share = MEMORY_PER_ENDPOINT * (endpoints - 1) / (1 << 20)
        of_which = f" ({endpoints} endpoints {share:.0f} of them)" if endpoints > 1 else ""
        raise UsageError(f"these settings may need {need:.0f} MiB{of_which}, over --memory-bytes "
                         f"{limit}: lower --queue-bytes, --replay-bytes, --max-line-bytes "
                         "or --batch-bytes, give fewer endpoints, or raise --memory-bytes "
                         '(README "Flow control and memory")')
    asked = " ".join([f"--{name.replace('_', '-')} {opt[name]}" for name in
                      ("max_line_bytes", "batch_bytes", "queue_bytes", "replay_bytes")
                      if opt[name] is not None]
                     + ([f"{endpoints} endpoints"] if endpoints > 1 else []))
    if opt["memory_bytes"] is not None and not asked:
        asked = "the other defaults"
    if asked:  # else these are the defaults of a mode that needs more (--json)
        warn(f"to fit --memory-bytes {limit} with {asked}: "
             f"{' and '.join(lowered)}, lowered from the defaults "
             '(README "Flow control and memory")')
    return fitted["queue_bytes"], fitted["replay_bytes"]


# --------------------------------------------------------------- security --
# Owns CURVE and the allowlists: certificates (ZPL files) and keys read and
# checked with the other options (a bad one is a usage error: options calls
# security_from), the socket options that apply them, and the ZAP handler
# (Gatekeeper) that admits or refuses --bind peers and says why handshakes failed.

CURVE_KEY_RE = re.compile(rb"^[0-9a-zA-Z.\-:+=^!/*?&<>()\[\]{}@%$#]{40}$")  # Z85, 32 bytes
CERT_MOST_BYTES = 64 << 10  # a certificate is a few hundred bytes


class Security(NamedTuple):
    """Validated CURVE keys (Z85 text) and allowlists.  curve is "" (off),
    "client" (connecting: server_key is the receiver's) or "server" (binding:
    clients are the public keys admitted); networks, if any, are the
    ipaddress networks a peer connecting to us must come from."""

    curve: str = ""
    public_key: bytes = b""
    secret_key: bytes = b""
    server_key: bytes = b""
    clients: frozenset = frozenset()
    networks: tuple = ()

    def zap(self) -> bool:
        """True if incoming connections must be checked by the ZAP handler."""
        return self.curve == "server" or bool(self.networks)


class _MakeCertAction(argparse.Action):
    """--make-cert PATH: write a key pair (see make_certificate), print where and
    the public key, exit 0; exit 2 if a file exists, 1 if it cannot be written."""

    def __call__(self, parser, namespace, values, option_string=None):
        try:
            public, secret, key = make_certificate(values)
        except OSError as exc:
            warn(f"--make-cert: cannot write {exc.filename}: {exc.strerror or exc}")
            parser.exit(EXIT_ERROR)
        parser.exit(write_stdout(f"public certificate: {public} (give it to the other side)\n"
                                 f"secret certificate: {secret} (keep it here, mode 600)\n"
                                 f"public key: {key}\n"))


def _cert_text(title: str, public: str, secret: str | None) -> str:
    """A certificate in ZPL, as czmq's zcert_save and pyzmq write it."""
    text = (f"#   ****  Generated on {time.strftime('%Y-%m-%d %H:%M:%S')} by zmqpush  ****\n"
            f"#   ZeroMQ CURVE {title}\n\nmetadata\ncurve\n"
            f'    public-key = "{public}"\n')
    return text + (f'    secret-key = "{secret}"\n' if secret else "")


def make_certificate(base: str) -> tuple:
    """Write a new CURVE key pair: base.key, the public certificate (mode 0644
    less the umask), and base.key_secret, both keys (mode 0600); the names
    pyzmq's create_certificates uses, which czmq's zcert_load("base.key") also
    finds.  Never overwrites: UsageError if either exists, or if base names
    no file (empty, or ending in "/": its files would be hidden ".key" files).
    Returns (public file, secret file, public key); OSError if they cannot be
    written (then neither is left behind)."""
    if not os.path.basename(base):
        raise UsageError(f"--make-cert {base!r}: name a file to write, such as "
                         "DIR/NAME (NAME.key and NAME.key_secret are written)")
    import zmq
    if not zmq.has("curve"):
        raise UsageError("this libzmq has no CURVE support")
    public_file, secret_file = base + ".key", base + ".key_secret"
    for path in (public_file, secret_file):
        if os.path.lexists(path):
            raise UsageError(f"--make-cert: {path} exists (not overwritten)")
    public, secret = (key.decode("ascii") for key in zmq.curve_keypair())
    written = []
    try:
        for path, mode, text in (
                (secret_file, 0o600, _cert_text(
                    "**Secret** Certificate\n#   DO NOT PROVIDE THIS FILE TO OTHER USERS "
                    "nor change its permissions.", public, secret)),
                (public_file, 0o644, _cert_text("Public Certificate", public, None))):
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
            written.append(path)
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(text)
    except OSError:
        for path in written:
            os.unlink(path)
        raise
    return public_file, secret_file, public


def read_certificate(path: str, what: str) -> tuple:
    """(public key, secret key or None), Z85 bytes, from the ZPL certificate at
    path.  UsageError, naming `what`, if it is missing, unreadable, not a
    regular file, larger than a certificate can be, or holds no valid key (or
    a secret key that does not belong to its public key)."""
    import zmq
    import zmq.auth
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise UsageError(f"{what} {path}: not a regular file")
        if info.st_size > CERT_MOST_BYTES:
            raise UsageError(f"{what} {path}: {info.st_size} bytes, not a certificate")
        public, secret = zmq.auth.load_certificate(path)
    except OSError as exc:
        raise UsageError(f"{what} {path}: {exc.strerror or 'cannot be read'}") from None
    except (ValueError, IndexError):  # pyzmq's parser: no key, or a key line without "="
        raise UsageError(f"{what} {path}: not a ZPL certificate (no curve public-key)") \
            from None
    for name, key in (("public-key", public), ("secret-key", secret)):
        if key is not None and not z85_key(key):
            raise UsageError(f"{what} {path}: malformed {name} "
                             "(expected 40 Z85 characters encoding 32 bytes)")
    if secret is not None and zmq.curve_public(secret) != public:
        raise UsageError(f"{what} {path}: its secret-key does not belong to its public-key")
    return public, secret


def z85_key(key: bytes) -> bool:
    """True if key is 40 Z85 characters that decode to 32 bytes (a group of
    five characters can exceed 2**32, which the alphabet alone does not tell)."""
    from zmq.utils import z85
    if not CURVE_KEY_RE.match(key):
        return False
    try:
        return len(z85.decode(key)) == 32
    except (ValueError, struct.error, KeyError):
        return False


def read_key_pair(path: str) -> tuple:
    """(public, secret) of --curve-cert: path itself, or path_secret when path
    holds only the public key (czmq's zcert_load does the same).  Warns, as
    ssh does, when the file holding the secret key is open to group or others."""
    public, secret = read_certificate(path, "--curve-cert")
    if secret is None:
        if not os.path.exists(path + "_secret"):
            raise UsageError(f"--curve-cert {path}: no secret-key in it, and no "
                             f"{path}_secret beside it")
        path += "_secret"
        public, secret = read_certificate(path, "--curve-cert")
        if secret is None:
            raise UsageError(f"--curve-cert {path}: no secret-key in it")
    mode = stat.S_IMODE(os.stat(path).st_mode)
    if mode & 0o077:
        warn(f"warning: {path} holds a secret key and is open to group or others "
             f"(mode {mode:o}): chmod 600 {path}")
    return public, secret


def read_clients(directory: str) -> frozenset:
    """The public keys of the certificates in directory (czmq's clientcertpath:
    every regular file but hidden ones).  UsageError if it cannot be listed,
    a file there is not a certificate, or there is none."""
    try:
        names = sorted(entry.name for entry in os.scandir(directory)
                       if not entry.name.startswith(".") and entry.is_file())
    except OSError as exc:
        raise UsageError(f"--curve-clients {directory}: {exc.strerror or exc}") from None
    keys = set()
    for name in names:
        path = os.path.join(directory, name)
        public, secret = read_certificate(path, "--curve-clients")
        if secret is not None:
            warn(f"warning: {path} holds a secret key: the server needs only the "
                 "client's public certificate")
        keys.add(public)
    if not keys:
        raise UsageError(f"--curve-clients {directory}: no certificate in it "
                         "(no client could connect)")
    return frozenset(keys)


def parse_networks(specs: list) -> tuple:
    """--allow values as ipaddress networks (a bare address is one host)."""
    import ipaddress
    networks = []
    for spec in specs:
        try:
            networks.append(ipaddress.ip_network(spec, strict=False))
        except ValueError:
            raise UsageError(f"--allow {spec!r}: not an address or network "
                             "(expected e.g. 10.0.0.0/8 or 192.0.2.7)") from None
    return tuple(networks)


def security_from(opt: dict, connect: list, bind: list) -> Security:
    """The Security of these options (see README "Security"); UsageError for a
    combination that cannot work or would admit anyone, or a bad file."""
    server_cert, cert, clients = opt["curve_server_cert"], opt["curve_cert"], opt["curve_clients"]
    for name, value in (("--curve-server-cert", server_cert), ("--curve-cert", cert),
                        ("--curve-clients", clients)):
        if value is not None and not value.strip():
            raise UsageError(f"{name} is empty: give a file (an empty value must not "
                             "turn encryption off)")
    if opt["allow"] is not None and not opt["allow"]:
        raise UsageError("--allow is empty: give at least one address or network (an "
                         "empty value must not admit everyone)")
    allow = opt["allow"] or []
    if allow and (connect or not bind):
        raise UsageError("--allow admits peers that connect to us: it needs --bind "
                         "and no --connect")
    if allow and any(not endpoint.startswith("tcp://") for endpoint in bind):
        raise UsageError("--allow checks IP addresses: it needs tcp:// endpoints")
    networks = parse_networks(allow)
    if not (server_cert or cert or clients):
        return Security(networks=networks)
    import zmq
    if not zmq.has("curve"):
        raise UsageError("this libzmq has no CURVE support")
    if connect and bind:
        raise UsageError("CURVE options apply to the whole socket: use them with "
                         "--connect or with --bind, not both")
    if connect:
        if clients:
            raise UsageError("--curve-clients is for --bind (the clients admitted)")
        if not server_cert:
            raise UsageError("--curve-cert with --connect needs --curve-server-cert "
                             "(the receiver's certificate)")
        server_key, server_secret = read_certificate(server_cert, "--curve-server-cert")
        if server_secret is not None:
            warn(f"warning: {server_cert} holds the receiver's secret key: give "
                 "--curve-server-cert its public certificate, and keep the secret on the receiver")
        public, secret = read_key_pair(cert) if cert else zmq.curve_keypair()
        return Security("client", public, secret, server_key=server_key)
    if server_cert:
        raise UsageError("--curve-server-cert is for --connect (binding, the server's "
                         "own key pair is --curve-cert)")
    if not cert:
        raise UsageError("--curve-clients needs --curve-cert (the server's own key pair)")
    if not clients:
        raise UsageError("--bind with --curve-cert needs --curve-clients DIR: without "
                         "it any client would be admitted")
    public, secret = read_key_pair(cert)
    return Security("server", public, secret, clients=read_clients(clients),
                    networks=networks)


ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # where libzmq asks (RFC 27)
ZAP_DOMAIN = b"zmqpush"
SAID_MOST = 1000  # refusals said one by one; past this many, only counted


def apply_security(sock, security: Security | None):
    """Set the CURVE options on the PUSH socket, and the ZAP domain that makes
    libzmq ask the handler (Gatekeeper) about every incoming connection, failing
    closed (ZAP_ENFORCE_DOMAIN) if no handler answers."""
    if security is None:
        return
    import zmq
    if security.curve == "client":
        sock.setsockopt(zmq.CURVE_SERVERKEY, security.server_key)
    elif security.curve == "server":
        sock.setsockopt(zmq.CURVE_SERVER, 1)
    if security.curve:
        sock.setsockopt(zmq.CURVE_PUBLICKEY, security.public_key)
        sock.setsockopt(zmq.CURVE_SECRETKEY, security.secret_key)
    if security.zap():
        sock.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN)
        sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)


def address_allowed(address: str, networks: tuple) -> bool:
    """True if the peer address (as ZAP gives it) is in one of networks; an
    IPv4 peer on an IPv6 socket (::ffff:a.b.c.d) counts as its IPv4 address."""
    import ipaddress
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    candidates = [ip] + ([ip.ipv4_mapped] if getattr(ip, "ipv4_mapped", None) else [])
    return any(c in network for c in candidates for network in networks
               if c.version == network.version)


# The socket monitor's events for a failed handshake: zmq.EVENT_HANDSHAKE_FAILED_
# NO_DETAIL (value: errno), _PROTOCOL (a protocol error code), _AUTH (ZAP status).
HANDSHAKE_FAILED_EVENTS = 0x0800 | 0x2000 | 0x4000
# libzmq's protocol error codes that get words of their own
_MECHANISM_MISMATCH = 0x11000002
_CRYPTOGRAPHIC = 0x11000001


def ready_messages(socket_of, zmq):
    """Every message ready now on a ZeroMQ socket watched through its FD
    (which signals edges only: a reader takes all that is ready), each as its
    frames; socket_of() gives the socket, None once it is closed (then no
    more, even in the middle)."""
    while True:
        sock = socket_of()
        if sock is None or not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return
        yield sock.recv_multipart(zmq.NOBLOCK)


class Gatekeeper:
    """Watches the security of connections.  In --bind mode with CURVE or
    --allow it is the socket context's ZAP handler (RFC 27): a ROUTER socket on
    inproc://zeromq.zap.01, watched by the loop through its descriptor (no
    timer), which admits a peer only if its address is allowed and, with CURVE,
    its public key is in --curve-clients.  A refused peer never completes the
    handshake, so ZeroMQ never gives it a message; each refusal is counted
    (counters.refused) and said once per address and key.

    handshake_failed() takes the monitor's HANDSHAKE_FAILED_* events: counted
    (counters.handshake_failures) and said once per endpoint and cause, with
    what to check.  These lines print even with -q: they are errors.  libzmq
    never reconnects after a receiver refused us (ZAP) or spoke another
    mechanism; so, connecting, the endpoint is connected again every
    RECONNECT_IVL_MAX_MS (a timer exists only while that lasts)."""

    def __init__(self, sock, security: Security | None, counters, connect: list, bind: list):
        import zmq
        self._zmq = zmq
        self._sock = sock
        self._security = security or Security()
        self._counters = counters
        self._connect = connect
        self._bind = bool(bind)
        self._said: set = set()
        self._retries: dict = {}  # endpoint -> TimerHandle of its next connect
        self._loop = asyncio.get_running_loop()
        self._handler = None
        if not self._security.zap():
            return
        self._handler = sock.context.socket(zmq.ROUTER)
        self._handler.setsockopt(zmq.LINGER, 0)
        self._handler.bind(ZAP_ENDPOINT)
        self._fd = self._handler.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._answer)
        self._loop.call_soon(self._answer)

    def close(self):
        """Stop answering and retrying (before the PUSH socket closes); idempotent."""
        for timer in self._retries.values():
            timer.cancel()
        self._retries.clear()
        if self._handler is not None:
            self._loop.remove_reader(self._fd)
            self._handler.close(linger=0)
            self._handler = None

    def _answer(self):
        """Answer every ZAP request ready now."""
        zmq = self._zmq
        for frames in ready_messages(lambda: self._handler, zmq):
            routing, request = frames[:2], frames[2:]
            status, text = self.decide(request)
            request_id = request[1] if len(request) > 1 else b""
            self._handler.send_multipart(
                [*routing, b"1.0", request_id, status, text, b"", b""], zmq.NOBLOCK)

    def decide(self, request: list) -> tuple:
        """(status code, text) for a ZAP request's frames: version, request id,
        domain, address, identity, mechanism, credentials."""
        if len(request) < 6 or request[0] != b"1.0":
            return b"500", b"malformed ZAP request"
        address = request[3].decode("ascii", "replace")
        from zmq.utils import z85
        mechanism, credentials = request[5], request[6:]
        security = self._security
        if security.networks and not address_allowed(address, security.networks):
            self._refuse(address, "", f"refused a peer from {address}: not in --allow")
            return b"400", b"address not allowed"
        if security.curve == "server":
            if mechanism != b"CURVE" or len(credentials) != 1 or len(credentials[0]) != 32:
                self._refuse(address, "", f"refused a peer from {address}: no CURVE key")
                return b"400", b"CURVE required"
            key = z85.encode(credentials[0])
            if key not in security.clients:
                who = key.decode("ascii")
                self._refuse(address, who, f"refused a client from {address}: its key "
                             f"{who} is not in --curve-clients")
                return b"400", b"key not allowed"
        elif mechanism != b"NULL":
            self._refuse(address, "", f"refused a peer from {address}: mechanism "
                         f"{mechanism.decode('ascii', 'replace')}")
            return b"400", b"mechanism not allowed"
        return b"200", b"OK"

    def _refuse(self, address: str, key: str, text: str):
        self._counters.refused += 1
        self._say_once((address, key), text)

    def _say_once(self, what: tuple, text: str):
        if what in self._said or len(self._said) > SAID_MOST:
            return
        self._said.add(what)
        if len(self._said) > SAID_MOST:
            text = f"{SAID_MOST} refusals and failed handshakes said: further ones are " \
                "only counted (--stats)"
        warn(text)

    def handshake_failed(self, event: int, value: int, endpoint: str):
        """A monitor HANDSHAKE_FAILED_* event (value: errno, protocol error or
        ZAP status): count it and say once per endpoint and cause what it means."""
        self._counters.handshake_failures += 1
        zmq = self._zmq
        if self._bind and event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return  # our own refusal, said by decide()
        cause = self._cause(event, value)
        if self._bind:
            self._say_once((endpoint, cause), f"a peer's handshake on {endpoint} failed: {cause}")
            return
        self._say_once((endpoint, cause), f"handshake with {endpoint} failed (retrying; "
                       f"lines read are kept): {cause}")
        if event != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:  # libzmq gave up on it
            self._retry(endpoint)

    def _retry(self, endpoint: str):
        """Connect the configured endpoint behind endpoint again, a while from
        now.  The monitor names it as configured, or, after one of libzmq's own
        reconnects, with the host resolved: then only a configured endpoint
        with the same port, if it is the only one, can be meant (with several,
        none is touched rather than drop a healthy connection)."""
        port = endpoint.rsplit(":", 1)[-1]
        same_port = [c for c in self._connect if c.rsplit(":", 1)[-1] == port]
        target = endpoint if endpoint in self._connect else \
            same_port[0] if len(same_port) == 1 else None
        if target is None or target in self._retries:
            return
        self._retries[target] = self._loop.call_later(RECONNECT_IVL_MAX_MS / 1000,
                                                      self._reconnect, target)

    def _reconnect(self, endpoint: str):
        del self._retries[endpoint]
        try:
            self._sock.disconnect(endpoint)
        except self._zmq.ZMQError:
            pass  # libzmq had already forgotten it
        self._sock.connect(endpoint)

    def _cause(self, event: int, value: int) -> str:
        """What a failed handshake means, in words, from our side."""
        zmq, curve = self._zmq, self._security.curve
        peer = "the peer" if self._bind else "the receiver"
        if event == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
            return (f"the receiver refused us (ZAP status {value}): is our public key "
                    f"{self._security.public_key.decode('ascii')} among its allowed clients?"
                    if curve else f"the receiver refused us (ZAP status {value})")
        if event == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
            if value == _MECHANISM_MISMATCH:
                return (f"{peer} does not speak CURVE" if curve else
                        f"{peer} requires a security mechanism (CURVE: "
                        + ("--curve-cert and --curve-clients)" if self._bind
                           else "--curve-server-cert)"))
            if value == _CRYPTOGRAPHIC:
                return "cryptographic error: the client does not have our server key"
            names = [name[15:] for name in dir(zmq) if name.startswith("PROTOCOL_ERROR_")
                     and getattr(zmq, name) == value]
            return f"protocol error {names[0] if names else ''} (0x{value:08x})"
        if curve == "client":
            return ("the receiver closed the connection during the CURVE handshake: it "
                    "does not speak CURVE, or --curve-server-cert is not its certificate")
        return f"the connection closed during the handshake ({os.strerror(value)})"


# --------------------------------------------------------------- encoding --
# Owns the wire format: bytes of whole lines in, valid JSON messages out; one
# interface for every encoder (EncoderBase) and one builder of zmqpush's own keys (OwnKeys).

_escape = json.encoder.c_encode_basestring or json.encoder.py_encode_basestring
# Bytes that need JSON escaping: '"', '\\' and controls.  "\n" is left out:
# it separates lines and is replaced by the message structure itself.
_SPECIAL = bytes([0x22, 0x5C, *range(0x20)]).replace(b"\n", b"")
_NOT_SPECIAL = bytes(b for b in range(256) if b not in _SPECIAL)
_ESCAPES = {b: (json.dumps(chr(b))[1:-1]).encode() for b in _SPECIAL}
# translate() returns its very input when the table changes no byte of it; a
# deletion table, by contrast, is built anew at every call (256 steps), which
# a single line cannot amortise.  Inputs this short take that test first.
_SPECIAL_TO_NEWLINE = bytes(0x0A if b in _SPECIAL else b for b in range(256))
SMALL_INPUT = 2048
# A raw NUL never survives escaping, so it can split encoded messages.
_MESSAGE_MARK = b"\x00"


def iso8601_utc(epoch: float) -> str:
    """e.g. 2026-11-21T23:36:59.123Z"""
    millis = int(epoch * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(millis // 1000)) + \
        f".{millis % 1000:03d}Z"


def _json_string(text: bytes) -> bytes:
    """A JSON string literal of valid UTF-8 text, as UTF-8 bytes."""
    return _escape(text.decode("utf-8")).encode("utf-8")


def _json_value(value) -> bytes:
    """A field's value as JSON: UTF-8 bytes are a string, a dict an object."""
    if isinstance(value, dict):
        return b"{" + b",".join(_json_string(k) + b":" + _json_value(v)
                                for k, v in value.items()) + b"}"
    return _json_string(value)


def valid_utf8(lines: bytes, window: int = 4096) -> bytes:
    """lines with each invalid UTF-8 sequence replaced by U+FFFD, exactly as
    decode("utf-8", "replace") would; valid lines come back as they are.

    A chunk with an invalid byte is repaired from its first error on, decoding
    `window` bytes at a time to find the next one and keeping the valid bytes
    as they are (decoding the whole chunk and encoding it again builds a text
    of up to four bytes a character: the cost this avoids).  Past one error
    per REPAIR_SPACING bytes the rest is decoded and encoded whole: one
    exception per error would cost more."""
    if lines.isascii():
        return lines
    try:
        lines.decode("utf-8")
    except UnicodeDecodeError as exc:
        return _repair_utf8(memoryview(lines), exc.start, exc.end, window)
    return lines


_REPLACEMENT = "\ufffd".encode()
REPAIR_SPACING = 512


def _repair_utf8(view: memoryview, start: int, end: int, window: int) -> bytes:
    """view with its invalid sequences replaced; the first is view[start:end]."""
    parts, kept, pos, size = [view[:start], _REPLACEMENT], end, end, len(view)
    for _ in range(16 + size // REPAIR_SPACING):
        try:
            while pos < size:
                pos += _utf8_decode(view[pos:pos + window], "strict", pos + window >= size)[1]
            break
        except UnicodeDecodeError as exc:
            parts += (view[kept:pos + exc.start], _REPLACEMENT)
            pos = kept = pos + exc.end
    else:
        parts.append(str(view[kept:], "utf-8", "replace").encode("utf-8"))
        return b"".join(parts)
    parts.append(view[kept:])
    return b"".join(parts)


def escape_utf8_lines(lines: bytes) -> bytes:
    """JSON-escape the text of lines, as UTF-8 bytes, keeping b"\\n" between lines.

    Invalid UTF-8 becomes U+FFFD (see valid_utf8); only the special bytes that
    occur cost a pass each.
    """
    if not lines.isascii():
        lines = valid_utf8(lines)
    if len(lines) <= SMALL_INPUT and lines.translate(_SPECIAL_TO_NEWLINE) is lines:
        return lines  # nothing to escape, told without building a deletion table
    present = lines.translate(None, _NOT_SPECIAL)
    if present:
        if 0x5C in present:  # a byte value, not b"\\": see Encoder.encode
            lines = lines.replace(b"\\", b"\\\\")  # first: later escapes add backslashes
        for byte in set(present) - {0x5C}:
            lines = lines.replace(bytes((byte,)), _ESCAPES[byte])
    return lines


class OwnKeys:
    """The one builder of zmqpush's own keys, as JSON bytes every encoder
    uses: "type", "@pid", the extra fields, "@timestamp" (--timestamp: when
    the line was read), "@continues" and the event id ("@metadata":{"_id":
    "RUN-SEQUENCE"}, --event-id, counted here)."""

    CONTINUES = b',"@continues":true'

    def __init__(self, logtype: bytes, pid: int, fields: tuple = (), timestamp: bool = False,
                 run_id: str | None = None):
        """logtype and the (key, value) fields are valid UTF-8 bytes (see utf8())."""
        self.base = (b'"type":' + _json_string(logtype) + b',"@pid":' + b"%d" % pid
                     + b"".join(b"," + _json_string(k) + b":" + _json_value(v)
                                for k, v in fields))
        self.timestamp = timestamp
        self.ids = run_id is not None
        # an event id: this % its sequence number
        self.id_form = b',"@metadata":{"_id":"%s-%%d"}' % (run_id or "").encode()
        self._sequence = 0

    def tail(self, read_at: float = 0.0, continues: bool = False) -> bytes:
        """The keys after an event's own, without the event id: the base, then
        "@timestamp" (read_at, epoch seconds) if on, "@continues" if continues."""
        tail = self.base
        if self.timestamp:
            tail += b',"@timestamp":"%s"' % iso8601_utc(read_at).encode()
        return tail + self.CONTINUES if continues else tail

    def event_id(self) -> bytes:
        """The next event's id, as a key to add (b"" without --event-id)."""
        if not self.ids:
            return b""
        self._sequence += 1
        return self.id_form % (self._sequence - 1)

    def take_ids(self, count: int) -> int:
        """The first of the next count event ids' sequence numbers (see id_form)."""
        first = self._sequence
        self._sequence += count
        return first


class EncoderBase:
    """What every encoder (plain, --json, --journal) gives the pipeline: encode()
    of whole lines, encode_parsed() of lines a stage parsed, encode_events()
    of joined events; each returns (messages, events): one message per
    event, or in batch mode JSON arrays of at most array_bytes (a larger
    event alone); events[i] is the number of events messages[i] carries.
    zmqpush's own keys come from one OwnKeys."""

    def __init__(self, logtype: bytes, pid: int, batch: bool, fields: tuple = (),
                 timestamp: bool = False, *, run_id: str | None = None,
                 array_bytes: int = DEFAULT_READ_BYTES):
        self._keys = OwnKeys(logtype, pid, fields, timestamp, run_id)
        self._batch = batch
        self._array_bytes = array_bytes

    def encode_parsed(self, lines: bytes, documents: list, read_at: float = 0.0) -> tuple:
        """Whole lines (CR stripped) whose parses a stage made (see ParsedLines):
        as encode() unless the encoder takes the parses."""
        return self.encode(lines, False, False, read_at)

    def _messages(self, events: list) -> tuple:
        """(messages, events) of encoded events: each its message, or arrays."""
        if not self._batch:
            return events, [1] * len(events)
        return group_events(events, self._array_bytes)


class Encoder(EncoderBase):
    """Turns chunks of complete lines into JSON messages, in bulk.

    Contract: for any bytes, every message is valid RFC 8259 JSON whose
    "message" is the line decoded as UTF-8 with U+FFFD for invalid bytes,
    followed by "type" and "@pid" in that order (and the extra fields).
    Work is per chunk, on bytes: a few C passes, none per line, except with
    event ids, which cost one formatting per line.  In batch mode no array
    message is longer than array_bytes unless it holds a single event.
    """

    def __init__(self, logtype: bytes, pid: int, batch: bool, fields: tuple = (),
                 timestamp: bool = False, *, run_id: str | None = None,
                 array_bytes: int = DEFAULT_READ_BYTES):
        """logtype and the (key, value) fields are valid UTF-8 bytes (see utf8())."""
        super().__init__(logtype, pid, batch, fields, timestamp, run_id=run_id,
                         array_bytes=array_bytes)
        self._head = b'{"message":"'
        self._tail = b'",' + self._keys.base  # the plain path's, made once
        self._plain = not (batch or timestamp or run_id is not None)
        self._closed = self._tail + b"}"
        self._between = self._closed + _MESSAGE_MARK + self._head

    def encode(self, lines: bytes, strip_cr: bool = True, continues: bool = False,
               read_at: float = 0.0) -> tuple:
        """Encode lines (each ending in b"\\n"; CR before it stripped if strip_cr).

        Returns (messages, events): one message per line, or in batch mode JSON
        arrays; events[i] is the number of lines messages[i] carries.
        continues marks a piece of an over-long line that the next message goes on;
        read_at (epoch seconds) is the "@timestamp" when that field is on.
        """
        # 0x0D, not b"\r": `in` first tries a bytes operand as an integer, and
        # the TypeError it raises and clears costs ten times the search.
        if strip_cr and 0x0D in lines:
            lines = lines.replace(b"\r\n", b"\n")
        if self._plain and not continues:  # the common case: tails made once
            escaped = escape_utf8_lines(lines)
            if escaped.find(b"\n") == len(escaped) - 1:
                return self._one(escaped, self._closed)
            return self._split((self._head + escaped).replace(b"\n", self._between))
        tail = b'",' + self._keys.tail(read_at, continues)
        escaped = escape_utf8_lines(lines)
        if self._keys.ids:
            return self._encode_with_ids(escaped, tail)
        tail += b"}"
        if escaped.find(b"\n") == len(escaped) - 1:
            return self._one(escaped, tail)
        if self._batch:
            between = tail + b"," + self._head
            body = escaped.replace(b"\n", between)
            return self._arrays(body, len(body) - len(between), between, tail)
        return self._split((self._head + escaped).replace(
            b"\n", tail + _MESSAGE_MARK + self._head))

    def encode_events(self, texts: list, cut: list, read_at: float = 0.0,
                      documents: list | None = None) -> tuple:
        """Encode whole events (--multiline), one per text: bytes that may hold
        b"\\n" between their lines and end in none.  cut[i] marks an event
        cut at a cap, whose rest the next one carries ("@continues":true).

        Returns (messages, events) as encode() does; a text without b"\\n"
        becomes what encode() makes of it as a line.  Inside a text "\\n" is
        escaped as \\n; fields, "@timestamp", event ids and --batch arrays
        are as encode() makes them (documents: none here, see JsonEncoder).
        Not for the plain mode: a joined trace is rare, and each text costs a
        few calls of its own."""
        tails = (b'",' + self._keys.tail(read_at), b'",' + self._keys.tail(read_at, True))
        objects = []
        for text, more in zip(texts, cut):
            escaped = escape_utf8_lines(text + b"\n")[:-1].replace(b"\n", b"\\n")
            objects.append(b"".join((self._head, escaped, tails[more], self._keys.event_id(),
                                     b"}")))
        return self._messages(objects)

    def _one(self, escaped: bytes, tail: bytes) -> tuple:
        """One escaped line as its message: one copy of a long line, not three
        (a line of megabytes is copied once); a short one in the fewest steps."""
        if len(escaped) <= SMALL_INPUT and not self._batch:
            return [(self._head + escaped).replace(b"\n", tail)], [1]
        view = memoryview(escaped)[:-1]
        return [b"".join((b"[", self._head, view, tail, b"]") if self._batch
                         else (self._head, view, tail))], [1]

    @staticmethod
    def _split(body: bytes) -> tuple:
        """Default mode: each line's newline became its tail, a mark and the
        next head; split at the marks (the last piece is a head no line follows)."""
        messages = body.split(_MESSAGE_MARK)
        messages.pop()
        return messages, [1] * len(messages)

    def _arrays(self, body: bytes, end: int, between: bytes, tail: bytes) -> tuple:
        """body[:end] (events joined by between) as arrays of at most array_bytes,
        cut where between stands: a raw '"' never occurs inside an escaped line."""
        view, most = memoryview(body), self._array_bytes - len(self._head) - len(tail) - 2
        messages, events, start = [], [], 0
        while True:
            cut = end
            if end - start > most:
                cut = body.rfind(between, start, start + most + len(between))
                if cut < 0:
                    cut = body.find(between, start, end)
                    cut = end if cut < 0 else cut
            messages.append(b"".join((b"[", self._head, view[start:cut], tail, b"]")))
            events.append(body.count(between, start, cut) + 1)
            if cut == end:
                return messages, events
            start = cut + len(between)

    def _encode_with_ids(self, escaped: bytes, tail: bytes) -> tuple:
        """One event per escaped line, each with its event id (see OwnKeys)."""
        form = (self._head + b"%s" + tail.replace(b"%", b"%%") + self._keys.id_form + b"}")
        lines = escaped.split(b"\n")[:-1]
        first = self._keys.take_ids(len(lines))
        return self._messages([form % pair for pair in zip(lines, itertools.count(first))])


def group_events(events: list, array_bytes: int) -> tuple:
    """(messages, counts): events as arrays of at most array_bytes (a larger
    event alone), the cuts found by bisection: a step per array, not per event."""
    # ends[k]: the bytes of events[:k], each counted with one comma
    ends = list(map(operator.add, itertools.accumulate(map(len, events), initial=0),
                    itertools.count(1)))
    messages, counts, start, total = [], [], 0, len(events)
    while start < total:
        stop = max(bisect.bisect_right(ends, ends[start] + array_bytes - 2, start + 1) - 1,
                   start + 1)
        messages.append(b"[" + b",".join(events[start:stop]) + b"]")
        counts.append(stop - start)
        start = stop
    return messages, counts


# --json and --journal (README "Structured logs"): the key and tag that mark a
# line sent as text, and the deepest nesting sent (Logstash's parser refuses
# more than 1,000 levels, Python's own recursion stops near there).
JSON_ERROR_KEY = "@json_error"
# Where an app's values that zmqpush's own keys replaced are kept (see merged_event).
REPLACED_KEY = "@json_replaced"
CONTINUES_KEY = "@continues"
NUMBER_OUT_OF_RANGE = "a number out of range"
JSON_FAILURE_TAG = "_jsonparsefailure"
MAX_JSON_DEPTH = 100
_JSON_SPACE = " \t\n\r"
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
# Logstash reads a key holding "[" or "]" as a field reference and refuses the event
# (_jsonparsefailure, or its input fails).
BRACKET_KEY_REFUSAL = "a key holds [ or ] (Logstash reads it as a field reference)"
# Logstash parses "@timestamp" leniently; this is the part of ISO 8601 it always takes.
_ISO8601 = re.compile(r"\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\d|3[01])T([01]\d|2[0-3]):[0-5]\d"
                      r":[0-5]\d(\.\d{1,9})?(Z|[+-]([01]\d|2[0-3]):[0-5]\d)", re.ASCII)


def iso8601_time(value) -> bool:
    """Whether value is an ISO 8601 time with its zone on a day that exists."""
    if not isinstance(value, str) or _ISO8601.fullmatch(value) is None:
        return False
    year, month, day = int(value[:4]), int(value[5:7]), int(value[8:10])
    leap = year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)
    return day <= (29 if leap else 28) if month == 2 else day <= 30 + (month + month // 8) % 2


class _NotFinite(ValueError):
    """NaN, Infinity or -Infinity: Python's parser takes them, JSON has none."""


def _refuse_constant(name: str):
    raise _NotFinite(name)


# The C scanner itself, without JSONDecoder.decode()'s Python steps around it.
_scan_json = json.JSONDecoder(parse_constant=_refuse_constant).scan_once
# A line this short cannot nest deeper than MAX_JSON_DEPTH.
QUICK_JSON_CHARS = 2 * MAX_JSON_DEPTH
# After a chunk with a line the scanner refused, this many are parsed line by line.
BULK_RETRY_CHUNKS = 16
# Lines are parsed and spliced in runs of about this many bytes: the objects of
# a whole read (256 KiB) outgrow the CPU's caches, and parsing slows by half.
JSON_RUN_BYTES = 32 << 10
_FIRST, _SECOND = operator.itemgetter(0), operator.itemgetter(1)
_FOURTH = operator.itemgetter(3)
_dump_json = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"),
                              allow_nan=False).encode

# Keys Logstash gives a meaning, what their value must be, and why not.
RESERVED_CHECKS = {
    "@timestamp": (iso8601_time, "not an ISO 8601 time with its zone"),
    "@metadata": (lambda v: isinstance(v, dict), "not an object"),
    "tags": (lambda v: isinstance(v, str) or (
        isinstance(v, list) and all(isinstance(t, str) for t in v)),
        "not a string or a list of strings"),
    "@version": (lambda v: isinstance(v, str), "not a string"),
    "event": (lambda v: isinstance(v, dict), "not an object"),
}


def json_depth(value) -> int:
    """Levels of objects and arrays in a parsed value (a scalar: 0)."""
    if isinstance(value, dict):
        return 1 + max(map(json_depth, value.values()), default=0)
    if isinstance(value, list):
        return 1 + max(map(json_depth, value), default=0)
    return 0


def may_hold_bracket_key(text: str) -> bool:
    """False if no key of the JSON text can hold "[" or "]" (nor escaped)."""
    return "[" in text or "]" in text or "\\u" in text


def bracket_key(value) -> bool:
    """Whether a key of a parsed value (at most MAX_JSON_DEPTH deep), at any
    depth, holds "[" or "]"."""
    if type(value) is dict:
        keys = "".join(value)
        return "[" in keys or "]" in keys or any(map(bracket_key, value.values()))
    if type(value) is list:
        return any(map(bracket_key, value))
    return False


def fix_reserved(obj: dict) -> list:
    """Move each reserved key of obj whose value Logstash would refuse to "_KEY";
    returns what was moved, in words (empty if nothing)."""
    fixes = []
    for key, (valid, why) in RESERVED_CHECKS.items():
        if key in obj and not valid(obj[key]):
            obj["_" + key] = obj.pop(key)
            fixes.append(f"{key} {why}: kept as _{key}")
    return fixes


def app_replaced(obj: dict, continues_ours: bool = False) -> bool:
    """Whether obj holds a value only zmqpush may set, which goes under
    REPLACED_KEY even where zmqpush sets none (see merged_event): a
    REPLACED_KEY that is not an object, or a CONTINUES_KEY (a receiver
    would join the next event to it) unless continues_ours (a stage's mark,
    see Unwrapping)."""
    return (CONTINUES_KEY in obj and not continues_ours) or (
        REPLACED_KEY in obj and not isinstance(obj[REPLACED_KEY], dict))


def merged_event(obj: dict, ours: dict, overwrite: bool, kept: dict | None = None,
                 continues_ours: bool = False) -> dict:
    """An app's object (its reserved keys checked) and zmqpush's own keys
    (ours) as one event, no value of the app's lost (README "Structured logs").

    The app's valid "@timestamp" is the event's time: the read time
    (--timestamp) goes to "event"."created" unless the app's "event" has
    one.  On any other key both set, ours win unless overwrite, and the app's
    values they replace are kept under REPLACED_KEY (with kept, values the
    caller replaced already); two objects ("@metadata", "host") merge key by
    key, the same way; "@json_error" is always ours.  REPLACED_KEY is ours
    too: the app's own, unless an object (then merged with ours one level,
    as a stage's before is), is kept under it by its own key.  So is the
    app's "@continues", always: only zmqpush's marks a cut event (obj's
    own is a stage's mark if continues_ours)."""
    ours, kept = dict(ours), dict(kept or {})
    read_time = ours.pop("@timestamp") if "@timestamp" in obj and "@timestamp" in ours else None
    event = dict(obj)
    for key, value in ours.items():
        if key not in obj:
            event[key] = value
        elif isinstance(obj[key], dict) and isinstance(value, dict):
            event[key] = merged_event(obj[key], value, overwrite)
            if REPLACED_KEY in event[key]:
                kept[key] = event[key].pop(REPLACED_KEY)
        elif key in (JSON_ERROR_KEY, CONTINUES_KEY) or not overwrite:
            kept[key] = obj[key]
            event[key] = value
    if CONTINUES_KEY in obj and CONTINUES_KEY not in ours and not continues_ours:
        kept[CONTINUES_KEY] = event.pop(CONTINUES_KEY)
    if kept or app_replaced(obj, continues_ours):
        before = obj.get(REPLACED_KEY)
        if isinstance(before, dict) and not before.keys() & kept.keys():
            kept = {**before, **kept}  # e.g. what a stage kept (Unwrapping): one level
        elif REPLACED_KEY in obj:
            kept[REPLACED_KEY] = before
        event[REPLACED_KEY] = kept
    if read_time is not None:
        app_event = event.get("event")
        if not isinstance(app_event, dict):
            event["event"] = {"created": read_time}
        elif "created" not in app_event:
            event["event"] = {**app_event, "created": read_time}
    return event


def _json_failure(exc: BaseException) -> str:
    """Why the scanner refused a line, in the words of "@json_error"."""
    if isinstance(exc, _NotFinite):
        return "NaN or Infinity"
    if isinstance(exc, RecursionError):
        return f"nested deeper than {MAX_JSON_DEPTH}"
    return "not JSON"


class JsonEncoder(EncoderBase):
    """--json: turns chunks of complete lines into events that carry each
    line's JSON object, with Encoder.encode's contract (one message per line,
    or arrays in batch mode; event ids, "@timestamp" and the extra fields).

    A line that is a JSON object is merged into the event, at the root or
    under target: its own text minus the closing brace, then zmqpush's keys
    (type, @pid, the fields, "@timestamp", "@metadata"), with no re-encoding,
    when none of its keys is one zmqpush writes or Logstash checks (see
    RESERVED_CHECKS).  Otherwise the slow path (merged_event) decides:
    zmqpush's keys win unless overwrite, the app's values they replace kept
    under REPLACED_KEY, the app's valid "@timestamp" wins, objects are
    merged; a reserved key Logstash would refuse is kept as "_KEY" and
    "@json_error" says so.
    Duplicate keys pass as they are: Logstash's parser keeps the last, as
    Python's does.

    Any other line (not JSON, not an object, NaN or Infinity, nesting deeper
    than MAX_JSON_DEPTH, invalid UTF-8, a lone surrogate, a piece of a line
    cut at --max-line-bytes) goes out as Encoder sends it, plus
    "tags":["_jsonparsefailure"] and "@json_error" saying why; counted in
    counters.json_failures (fixes in counters.json_fixed).
    """

    splices = True  # an object none of whose keys is watched is sent as its text

    def __init__(self, logtype: bytes, pid: int, batch: bool, fields: tuple = (),
                 timestamp: bool = False, *, run_id: str | None = None,
                 array_bytes: int = DEFAULT_READ_BYTES, counters: Counters | None = None,
                 target: str | None = None, message_key: str | None = None,
                 overwrite: bool = False, checked: frozenset = frozenset()):
        """As Encoder; counters get the failures; target, message_key and
        overwrite are --json-target, --json-message-key and --json-overwrite;
        checked: reserved keys a stage before made valid (see Unwrapping)."""
        super().__init__(logtype, pid, batch, fields, timestamp, run_id=run_id,
                         array_bytes=array_bytes)
        self._counters = counters if counters is not None else Counters()
        self._target = target
        self._target_head = (None if target is None
                             else b"{" + _json_string(target.encode()) + b":")
        self._message_key = message_key
        self._overwrite = overwrite
        ours = {k.decode() for k, _ in fields} | {"type", "@pid", CONTINUES_KEY,
                                                   JSON_ERROR_KEY, REPLACED_KEY}
        self._continues_ours = CONTINUES_KEY in checked  # a stage's pieces
        self._watched = frozenset(ours | set(RESERVED_CHECKS)
                                  | ({message_key} if message_key else set())) - checked
        self._cut = False  # the next line is the last piece of a line that was cut
        self._bulk_wait = 0  # chunks to parse line by line yet (see _parse_all)

    def encode(self, lines: bytes, strip_cr: bool = True, continues: bool = False,
               read_at: float = 0.0) -> tuple:
        """As Encoder.encode: (messages, events) of lines, each ending in b"\\n"."""
        if strip_cr and 0x0D in lines:
            lines = lines.replace(b"\r\n", b"\n")
        tail = self._keys.tail(read_at)
        events = []
        if continues or self._cut:  # a piece of a cut line: the segment's first line
            first = lines.index(b"\n")
            events.append(self._piece(lines[:first], tail, continues))
            lines = lines[first + 1:]
        self._cut = continues
        start, size = 0, len(lines)
        while start < size:
            end = lines.find(b"\n", start + JSON_RUN_BYTES) + 1 or size
            events += self._events(lines[start:end] if start or end < size else lines, tail)
            start = end
        return self._messages(events)

    def encode_parsed(self, lines: bytes, documents: list, read_at: float = 0.0) -> tuple:
        """As encode() for whole lines (CR stripped) that a stage parsed already
        (see ObjectView._record): documents[i] is line i's (text without
        leading whitespace, object, end, whether nothing was stripped), or
        None for a line that is not an object (or whose parse was not kept:
        it is parsed here).  No line is parsed again."""
        if self._cut:  # the last piece of a cut line comes first: as encode() does
            return self.encode(lines, False, False, read_at)
        tail = self._keys.tail(read_at)
        raws = lines.split(b"\n")
        raws.pop()
        if not self._keys.ids and None not in documents and all(map(_FOURTH, documents)):
            texts = list(map(_FIRST, documents))
            parsed = [(obj, end) for _, obj, end, _ in documents]
            if self._spliceable("\n".join(texts), texts, parsed):
                return self._messages(self._splice_all(lines, tail + b"}"))
        ids, closing, events = self._keys.ids, tail + b"}", []
        for raw, document in zip(raws, documents):
            end = self._closing(tail) if ids else closing
            if document is None:
                events.append(self._event(raw, self._texts([raw])[0], end))
            else:
                events.append(self._parsed(raw, document[0], document[1], document[2], end))
        return self._messages(events)

    def encode_events(self, texts: list, cut: list, read_at: float = 0.0,
                      documents: list | None = None) -> tuple:
        """Encode whole events (--multiline per source, see ObjectView), one
        per text, as encode() does a line; cut[i] adds "@continues":true.  A
        text that holds b"\\n" is lines that were not JSON objects, joined: it
        goes out as one such line does, its newlines escaped in "message"
        (counted once in json_failures, "@json_error" saying why its first
        line was refused).  Any other text is a line (without b"\\n"), whose
        parse documents[i] may give (see encode_parsed): not parsed again."""
        tail = self._keys.tail(read_at)
        events, tails = [], (tail, tail + OwnKeys.CONTINUES)
        for index, (text, more) in enumerate(zip(texts, cut)):
            end = tails[more]
            document = documents[index] if documents is not None else None
            if 0x0A in text:
                events.append(self._failed_text(text, end))
            elif document is not None:
                closing = self._closing(end) if self._keys.ids else end + b"}"
                events.append(self._parsed(text, document[0], document[1], document[2],
                                           closing))
            else:
                events += self._events(text + b"\n", end)
        return self._messages(events)

    def _failed_text(self, text: bytes, tail: bytes) -> bytes:
        """Lines that were not JSON objects, joined by b"\\n", as one event."""
        first = text[:text.index(b"\n")]
        try:
            why = self._why_not(first.decode("utf-8").lstrip(_JSON_SPACE))
        except UnicodeDecodeError:
            why = "invalid UTF-8"
        closing = self._closing(tail) if self._keys.ids else tail + b"}"
        self._counters.json_failures += 1
        return self._marked_text(
            escape_utf8_lines(text + b"\n")[:-1].replace(b"\n", b"\\n"), closing, why)

    def _events(self, lines: bytes, tail: bytes) -> list:
        """The events of whole lines: all parsed in one go and, when every one is
        an object that can be spliced, spliced in one go; else line by line."""
        try:
            text = lines.decode("utf-8")
        except UnicodeDecodeError:
            raws = lines.split(b"\n")
            raws.pop()
            return self._each(raws, self._texts(raws), tail)
        texts = text.split("\n")
        texts.pop()
        parsed = self._parse_all(texts)
        if parsed is not None and not self._keys.ids and self._spliceable(text, texts, parsed):
            return self._splice_all(lines, tail + b"}")
        raws = lines.split(b"\n")
        raws.pop()
        if parsed is None:
            return self._each(raws, texts, tail)
        ids, closing, event = self._keys.ids, tail + b"}", self._parsed
        return [event(raw, text, obj, end, self._closing(tail) if ids else closing)
                for raw, text, (obj, end) in zip(raws, texts, parsed)]

    def _parse_all(self, texts: list) -> list | None:
        """(object, end) of every text, by the C scanner alone, or None when
        one is refused: then lines are parsed one by one, for this chunk and
        the next BULK_RETRY_CHUNKS (input that mixes in other lines)."""
        if self._bulk_wait:
            self._bulk_wait -= 1
            return None
        try:  # the scanner's StopIteration (no value at all) ends map() early
            parsed = list(map(_scan_json, texts, itertools.repeat(0)))
        except (ValueError, RecursionError):
            parsed = None
        if parsed is None or len(parsed) != len(texts):
            self._bulk_wait = BULK_RETRY_CHUNKS
            return None
        return parsed

    def _spliceable(self, text: str, texts: list, parsed: list) -> bool:
        """True if every line of text (texts) is a non-empty object, parsed to
        its end, with no key watched, no escaped surrogate and not too deep:
        the fast path of each."""
        objects = list(map(_FIRST, parsed))
        return (self.splices and list(map(_SECOND, parsed)) == list(map(len, texts))
                and set(map(type, objects)) == {dict} and all(objects)
                and all(map(self._watched.isdisjoint, objects))
                and ("\\u" not in text or _SURROGATE_ESCAPE.search(text) is None)
                and not self._may_be_too_deep(text, texts)
                and not (may_hold_bracket_key(text) and any(
                    bracket_key(obj) for line, obj in zip(texts, objects)
                    if may_hold_bracket_key(line))))

    @staticmethod
    def _may_be_too_deep(text: str, texts: list) -> bool:
        """Whether a line of text (texts, each an object) may nest deeper than
        MAX_JSON_DEPTH: only one with more brackets than that, which is more
        than one bracket a line over all lines."""
        if text.count("{") + text.count("[") - len(texts) < MAX_JSON_DEPTH:
            return False
        return any(len(t) > QUICK_JSON_CHARS and t.count("{") + t.count("[") > MAX_JSON_DEPTH
                   for t in texts)

    def _splice_all(self, lines: bytes, closing: bytes) -> list:
        """Every line (each an object ending in "}") spliced, in a few passes."""
        head = self._target_head
        if head is None:
            body = lines.replace(b"}\n", b"," + closing + _MESSAGE_MARK)
        else:
            body = (head + lines).replace(b"\n", b"," + closing + _MESSAGE_MARK + head)
        messages = body.split(_MESSAGE_MARK)
        messages.pop()
        return messages

    def _each(self, raws: list, texts: list, tail: bytes) -> list:
        """The events of lines, one by one."""
        ids, closing, event = self._keys.ids, tail + b"}", self._event
        return [event(raw, text, self._closing(tail) if ids else closing)
                for raw, text in zip(raws, texts)]

    @staticmethod
    def _texts(raws: list) -> list:
        """Each line decoded, or None where it is not valid UTF-8."""
        texts = []
        for raw in raws:
            try:
                texts.append(raw.decode("utf-8"))
            except UnicodeDecodeError:
                texts.append(None)
        return texts

    def _closing(self, tail: bytes) -> bytes:
        """tail, the next event id, and the closing brace."""
        return tail + self._keys.event_id() + b"}"

    def _event(self, raw: bytes, text: str | None, closing: bytes) -> bytes:
        """One line's event; closing holds zmqpush's keys and the closing brace."""
        if text is None:
            return self._failed(raw, closing, "invalid UTF-8")
        stripped = text.lstrip(_JSON_SPACE)
        if stripped[:1] != "{":
            return self._failed(raw, closing, self._why_not(stripped))
        try:
            obj, end = _scan_json(stripped, 0)
        except (ValueError, StopIteration, RecursionError) as exc:
            return self._failed(raw, closing, _json_failure(exc))
        return self._parsed(raw, stripped, obj, end, closing)

    def _parsed(self, raw: bytes, text: str, obj, end: int, closing: bytes) -> bytes:
        """The event of raw, whose text (leading whitespace stripped) the
        scanner parsed to obj, up to end."""
        if end != len(text) and text[end:].strip(_JSON_SPACE):
            return self._failed(raw, closing, "not JSON")
        if type(obj) is not dict:
            return self._failed(raw, closing, "not a JSON object")
        body = raw if end == len(text) and raw[:1] == b"{" else raw.strip(b" \t\n\r")
        if (self.splices and ("\\u" not in text or _SURROGATE_ESCAPE.search(text) is None)
                and self._watched.isdisjoint(obj)
                and (len(text) <= QUICK_JSON_CHARS
                     or text.count("{") + text.count("[") <= MAX_JSON_DEPTH)
                and not (may_hold_bracket_key(text) and bracket_key(obj))):
            return self._splice(body, bool(obj), closing)
        return self._object_event(raw, body, text, obj, closing)

    def _splice(self, body: bytes, keys: bool, closing: bytes) -> bytes:
        """The object's own text (body, ending in "}") with zmqpush's keys added."""
        if self._target_head is not None:
            return b"".join((self._target_head, body, b",", closing))
        return b"".join((body[:-1], b"," if keys else b"", closing))

    def _object_event(self, raw: bytes, body: bytes, text: str, obj: dict,
                      closing: bytes) -> bytes:
        """The slow path: a refused object, a collision, a reserved key or the
        message key (see the class docstring)."""
        refusal = self._refusal(text, obj)
        if refusal is not None:
            return self._failed(raw, closing, refusal)
        key, fixes, moved = self._message_key, [], False
        if key and isinstance(obj.get(key), str):
            message, moved = obj.pop(key), True
        if self._target is not None:
            obj = {self._target: obj}
        else:
            fixes = fix_reserved(obj)
        kept = {}
        if moved:
            if "message" in obj:  # the app's own "message": kept (see merged_event)
                kept["message"] = obj["message"]
            obj["message"] = message
        ours = json.loads(b"{" + closing)
        if not (fixes or moved or app_replaced(obj, self._continues_ours)) \
                and ours.keys().isdisjoint(obj):
            return self._splice(body, bool(obj), closing)
        if fixes:
            ours[JSON_ERROR_KEY] = "; ".join(fixes)
        return self._dump(merged_event(obj, ours, self._overwrite, kept,
                                       self._continues_ours), fixes) or \
            self._failed(raw, closing, NUMBER_OUT_OF_RANGE)

    def _dump(self, event: dict, fixes: list) -> bytes:
        """event as JSON, counted in json_fixed when fixes (their "@json_error"
        set already); b"" if a number in it is out of range (1e400 parses as
        infinity)."""
        try:
            text = _dump_json(event)
        except ValueError:
            return b""
        if fixes:
            self._counters.json_fixed += 1
        return text.encode("utf-8")

    @staticmethod
    def _refusal(text: str, obj: dict) -> str | None:
        """Why a parsed object cannot be sent as JSON (too deep, a lone
        surrogate) or taken by Logstash (a bracket in a key), or None."""
        if text.count("{") + text.count("[") > MAX_JSON_DEPTH:
            try:
                deep = json_depth(obj) > MAX_JSON_DEPTH
            except RecursionError:
                deep = True
            if deep:
                return f"nested deeper than {MAX_JSON_DEPTH}"
        if _SURROGATE_ESCAPE.search(text):
            try:
                _dump_json(obj).encode("utf-8")
            except UnicodeEncodeError:
                return "lone surrogate"
            except ValueError:
                return NUMBER_OUT_OF_RANGE
        if may_hold_bracket_key(text) and bracket_key(obj):
            return BRACKET_KEY_REFUSAL
        return None

    @staticmethod
    def _why_not(text: str) -> str:
        """Why text (not an object, leading whitespace stripped) is refused."""
        try:
            end = _scan_json(text, 0)[1]
        except (ValueError, StopIteration, RecursionError) as exc:
            return _json_failure(exc)
        if text[end:].strip(_JSON_SPACE):
            return "not JSON"
        return "not a JSON object"

    def _failed(self, raw: bytes, closing: bytes, why: str) -> bytes:
        """The line as Encoder sends it, marked as not merged."""
        self._counters.json_failures += 1
        return self._marked_text(escape_utf8_lines(raw + b"\n")[:-1], closing, why)

    @staticmethod
    def _marked_text(escaped: bytes, closing: bytes, why: str) -> bytes:
        """The event of an escaped message sent as text, marked as not merged."""
        return b"".join((b'{"message":"', escaped, b'",', closing[:-1], b',"tags":["',
                         JSON_FAILURE_TAG.encode(), b'"],"', JSON_ERROR_KEY.encode(),
                         b'":"', why.encode(), b'"}'))

    def _piece(self, raw: bytes, tail: bytes, continues: bool) -> bytes:
        """A piece of a line cut at --max-line-bytes: never JSON on its own."""
        if continues:
            tail += OwnKeys.CONTINUES
        closing = self._closing(tail) if self._keys.ids else tail + b"}"
        return self._failed(raw, closing, "line cut at --max-line-bytes")


# journalctl -o json (README "Structured logs"): the fields that get names of
# their own, as (journal field, plain name, ECS path (--host-field-ecs), a number).
JOURNAL_FIELDS = (
    ("PRIORITY", ("severity",), ("log", "syslog", "severity", "code"), True),
    ("SYSLOG_FACILITY", ("facility",), ("log", "syslog", "facility", "code"), True),
    ("SYSLOG_IDENTIFIER", ("program",), ("log", "syslog", "appname"), False),
    ("_SYSTEMD_UNIT", ("unit",), ("systemd", "unit"), False),
    ("_PID", ("pid",), ("process", "pid"), True),
    ("_HOSTNAME", ("logsource",), ("host", "hostname"), False),
)
# The entry's other fields go under this key, as journalctl names them.
JOURNAL_REST_KEY = "journald"
# Times from 1970 to 9999: what ISO 8601's four-digit years can say.
_LAST_JOURNAL_SECOND = 253402300799


def journal_number(value) -> bool:
    """Whether value is a journal field's number: ASCII digits an int64 holds
    (longer ones stay text; int() would refuse over 4,300 digits)."""
    return isinstance(value, str) and value.isascii() and value.isdigit() and len(value) <= 19


def journal_value(value):
    """A journal field's value: text as it is; a byte array (journalctl's form
    for data that is not UTF-8 text: a list of numbers) decoded with U+FFFD; a
    repeated field (a list of values) as a list of such values; null as None."""
    if not isinstance(value, list):
        return value
    if value and all(type(b) is int for b in value):
        try:
            return bytes(value).decode("utf-8", "replace")
        except ValueError:  # numbers outside 0..255: not a byte array
            pass
    return [journal_value(v) for v in value]


def iso8601_micros(micros: int) -> str | None:
    """e.g. 2026-11-21T23:36:59.123456Z; None outside years 1970 to 9999."""
    seconds, fraction = divmod(micros, 1_000_000)
    if not 0 <= seconds <= _LAST_JOURNAL_SECOND:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{fraction:06d}Z"


def _put(event: dict, path: tuple, value):
    """event[path[0]][path[1]]... = value, making the objects on the way."""
    for key in path[:-1]:
        inner = event.get(key)
        if not isinstance(inner, dict):
            inner = event[key] = {}
        event = inner
    event[path[-1]] = value


class JournalEncoder(JsonEncoder):
    """--journal: JsonEncoder for `journalctl -o json` entries.

    MESSAGE becomes "message" (a byte array decoded, a repeated field joined
    by newlines; null, which journalctl writes for fields over 4,096 bytes
    without --all, leaves none and "@json_error" says so);
    __REALTIME_TIMESTAMP (microseconds) "@timestamp"; __CURSOR "@metadata"
    "_id"; the JOURNAL_FIELDS their names (ECS paths with ecs; a repeated
    one gives its first value); every other field goes under "journald".
    The entry's fields win over zmqpush's keys (see merged_event): its time
    over --timestamp's (kept as "event"."created"), its cursor over
    --event-id."""

    splices = False

    def __init__(self, *args, ecs: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        self._ecs = ecs

    def _object_event(self, raw: bytes, body: bytes, text: str, obj: dict,
                      closing: bytes) -> bytes:
        refusal = self._refusal(text, obj)
        if refusal is not None:
            return self._failed(raw, closing, refusal)
        ours = json.loads(b"{" + closing)
        entry, notes = self._entry(obj)
        if notes:
            ours[JSON_ERROR_KEY] = "; ".join(notes)
        return self._dump(merged_event(entry, ours, True), notes) or \
            self._failed(raw, closing, NUMBER_OUT_OF_RANGE)

    def _entry(self, obj: dict) -> tuple:
        """(fields, notes): the entry's fields as the event carries them."""
        event, notes = {}, []
        if "MESSAGE" in obj:
            message = journal_value(obj["MESSAGE"])
            if isinstance(message, list) and all(isinstance(m, str) for m in message):
                message = "\n".join(message)
            if isinstance(message, str):
                event["message"] = message
                del obj["MESSAGE"]
            elif message is None:
                del obj["MESSAGE"]
                notes.append("MESSAGE is null (over 4096 bytes: run journalctl with --all)")
            else:  # kept as it came, under JOURNAL_REST_KEY
                notes.append(f"MESSAGE is neither text nor bytes: kept under {JOURNAL_REST_KEY}")
        stamp = obj.get("__REALTIME_TIMESTAMP")
        when = iso8601_micros(int(stamp)) if journal_number(stamp) else None
        if when is not None:
            event["@timestamp"] = when
            del obj["__REALTIME_TIMESTAMP"]
        if isinstance(obj.get("__CURSOR"), str):
            event["@metadata"] = {"_id": obj.pop("__CURSOR")}
        for field, plain, ecs, number in JOURNAL_FIELDS:
            value = journal_value(obj.get(field))
            several = isinstance(value, list) and len(value) > 1  # all kept, JOURNAL_REST_KEY
            if isinstance(value, list):
                value = value[0] if value else None
            if not isinstance(value, str):
                continue
            if not several:
                del obj[field]
            _put(event, ecs if self._ecs else plain,
                 int(value) if number and journal_number(value) else value)
        if obj:
            event[JOURNAL_REST_KEY] = {key: journal_value(v) for key, v in obj.items()}
        return event, notes


# ---------------------------------------------------------------- framing --
# Owns the counters and line framing: Segments (runs of whole lines, long lines cut
# into pieces), what every pipeline starts with.

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
        self.disconnects = 0
        self.events_replayed = 0
        self.events_requeued = 0  # put back in the queue to be replayed (no spool)
        self.events_refused = 0  # --confirm: lines (not pieces) answered with a refusal
        self.handshake_failures = 0
        self.refused = 0
        self.events_found = 0  # read from what a previous run left in the spool
        self.events_unspooled = 0  # read, never written to the spool (write errors)
        self.events_memory_only = 0  # read, not spooled, queued in memory (SpoolQueue)
        self.spool_corrupt = 0
        self.events_joined = 0  # --multiline: events of several lines
        self.lines_joined = 0  # the lines in them
        self.events_cut = 0  # events cut at a --multiline cap
        self.events_pushed_out = 0  # unfinished, past the per-source caps (ObjectView)
        self.events_answered = 0  # --confirm --multiline, no spool: in Answered items
        self.json_failures = 0  # --json, --journal: lines sent as text (see JsonEncoder)
        self.json_fixed = 0  # --json, --journal: events with a field moved or noted

    def not_handed(self) -> int:
        """Events read and not dropped that ZeroMQ has not accepted (yet)."""
        return self.events_read - self.events_dropped - self.events_handed


# Builds a NamedTuple from all its fields without its __new__, a Python-level
# call: Segments and Parcels are made for every line that trickles in.
_new_tuple = tuple.__new__


class Segment(NamedTuple):
    """An item of the reading pipeline: a run of complete lines (each its own
    event), or one piece of an over-long line (continues: the next piece
    goes on it).  held: how many of its first lines a stage held before
    (--confirm answered them already, see Ledger)."""

    lines: bytes
    strip_cr: bool = True
    continues: bool = False
    held: int = 0
    joins = False  # see Joined

    def nlines(self) -> int:
        """The lines it carries (a piece counts as one)."""
        return self.lines.count(b"\n")

    def encoded(self, encoder, read_at: float) -> tuple:
        """(messages, events, ends_line) of its lines (see Parcel)."""
        messages, events = encoder.encode(self.lines, self.strip_cr, self.continues, read_at)
        ends = [True] * len(messages)
        if self.continues:
            ends[-1] = False
        return messages, events, ends

    def split(self, lines: int) -> tuple:
        """(its first `lines` lines, the rest), either None when empty."""
        cut = lines_end(self.lines, lines)
        first = self._replace(lines=self.lines[:cut], held=min(self.held, lines)) if cut else None
        rest = (self._replace(lines=self.lines[cut:], held=max(0, self.held - lines))
                if cut < len(self.lines) else None)
        return first, rest


def lines_end(lines: bytes, count: int) -> int:
    """Where the first `count` lines of lines (each ending in b"\\n") end."""
    cut = 0
    for _ in range(count):
        cut = lines.index(b"\n", cut) + 1
    return cut


# Lines longer than this leave the reader in a Segment of their own.
LONE_LINE_BYTES = 64 << 10


class LineFramer:
    """Splits a byte stream into Segments; keeps the unfinished last line.

    No line longer than max_line_bytes is ever held: longer ones leave as
    pieces cut at UTF-8 character boundaries, all but the last marked continues.
    Every message is at most max_line_bytes once invalid UTF-8 became U+FFFD
    (a line's CR before its newline is not part of its message);
    max_line_bytes >= 4, one UTF-8 character, so a cut in valid UTF-8 never
    falls inside a character.

    Repair can triple a line (an invalid byte becomes the 3 bytes of U+FFFD):
    a Segment that holds a line longer than a third of the limit and is not
    ASCII is repaired here, and cut again if it grew past the limit (the
    encoder finds it valid then).  Shorter lines, the common case, cost no
    test beyond a comparison or a few searches (see _fits_repaired).

    piece_bytes (at most max_line_bytes, 4 or more; max_line_bytes if not
    given): the size of the pieces, all of a line's pieces, its last one
    too, when lines up to max_line_bytes must come whole (--docker, --cri:
    an envelope is parsed whole) while the messages' limit is smaller.
    """

    def __init__(self, max_line_bytes: int, piece_bytes: int | None = None):
        self._max = max_line_bytes
        self._piece = max_line_bytes if piece_bytes is None else piece_bytes
        self._lone = min(max_line_bytes, LONE_LINE_BYTES)
        self._third = max_line_bytes // 3  # a line this long fits even once repaired
        self._pending = bytearray()
        self._cutting = False  # pieces of the pending line left: its tail is cut too

    def feed(self, data: bytes) -> list:
        """Segments completed by data, in order."""
        newline = data.rfind(b"\n")
        if 0 <= newline == len(data) - 1 and newline <= self._lone and not self._pending \
                and (newline <= self._third or lines_within(data, self._third)):
            return [_new_tuple(Segment, (data, True, False, 0))]  # the common read: whole
            # short lines, nothing held
        if newline < 0:
            self._pending += data
            return self._repaired(self._split_pending())
        view = memoryview(data)
        complete = (b"".join((self._pending, view[: newline + 1])) if self._pending
                    else data[: newline + 1])
        self._pending = bytearray(view[newline + 1:])
        return self._repaired(self._tail_cut(complete) + self._split_pending())

    def _tail_cut(self, complete: bytes) -> list:
        """complete as Segments; if pieces of its first line left already,
        that line's tail cut into pieces too (see piece_bytes)."""
        if not self._cutting:
            return self._segments(complete)
        self._cutting = False
        end = complete.index(b"\n") + 1
        tail = self._pieces(complete[:end - 1])
        return tail + self._segments(complete[end:]) if end < len(complete) else tail

    def finish(self) -> list:
        """The unfinished last line (no newline at EOF), if any."""
        if not self._pending:
            return []
        last, self._pending = bytes(self._pending), bytearray()
        if self._cutting:
            self._cutting = False
            return self._repaired(self._pieces(last, strip_cr=False))
        return self._repaired([Segment(last + b"\n", strip_cr=False)])

    def _repaired(self, segments: list) -> list:
        """segments, each that repair would take past the limit repaired and cut
        again: a run of lines as _segments() cuts it, a piece (or the last line
        at EOF, whose CR stays) into pieces of its own, the last keeping its
        marks."""
        if all(self._fits_repaired(seg.lines) for seg in segments):
            return segments
        out = []
        for seg in segments:
            fixed = seg.lines if self._fits_repaired(seg.lines) else valid_utf8(seg.lines)
            if fixed is seg.lines:
                out.append(seg)
            elif seg.strip_cr:
                out += self._segments(fixed)
            else:
                out += self._pieces(fixed[:-1], strip_cr=False, continues=seg.continues)
        return out

    def _fits_repaired(self, lines: bytes) -> bool:
        """True if no line of lines (ending in b"\\n") can pass the limit once
        repaired: each is at most a third of it, or all are ASCII."""
        return len(lines) <= self._third + 1 or lines_within(lines, self._third) \
            or lines.isascii()

    def _segments(self, complete: bytes) -> list:
        """complete (whole lines) as Segments, over-long lines split into pieces,
        and a line over LONE_LINE_BYTES in a Segment of its own (the encoder
        then copies it once, not three times)."""
        if lines_within(complete, min(self._max, LONE_LINE_BYTES)):
            return [Segment(complete)]
        lines = complete.split(b"\n")[:-1]
        out, run = [], []
        for line in lines:
            if len(line) <= min(LONE_LINE_BYTES, self._max + (line[-1:] == b"\r")):
                run.append(line)
                continue
            if len(line) <= self._max + (line[-1:] == b"\r"):
                if run:
                    out.append(Segment(b"\n".join(run) + b"\n"))
                    run = []
                out.append(Segment(line + b"\n"))
                continue
            if run:
                out.append(Segment(b"\n".join(run) + b"\n"))
                run = []
            out.extend(self._pieces(line))
        if run:
            out.append(Segment(b"\n".join(run) + b"\n"))
        return out

    def _pieces(self, line: bytes, strip_cr: bool = True, continues: bool = False) -> list:
        """line as pieces of at most piece_bytes (a CR that strip_cr strips not
        counted), all but the last marked continues; the last is marked as
        strip_cr and continues say."""
        out = []
        while len(line) > self._piece + (strip_cr and line[-1:] == b"\r"):
            cut = self._cut(line)
            out.append(Segment(line[:cut] + b"\n", strip_cr=False, continues=True))
            line = line[cut:]
        out.append(Segment(line + b"\n", strip_cr, continues))
        return out

    def _split_pending(self) -> list:
        """The pending line's pieces while it is over max_line_bytes (then
        over piece_bytes)."""
        out = []
        while len(self._pending) > (self._piece if self._cutting else self._max):
            cut = self._cut(self._pending)
            out.append(Segment(bytes(self._pending[:cut]) + b"\n",
                               strip_cr=False, continues=True))
            del self._pending[:cut]
            self._cutting = True
        return out

    def _cut(self, line) -> int:
        """Where to end a piece of at most piece_bytes: not inside a UTF-8
        character, not between CR and what follows it."""
        cut = back = self._piece
        while back > cut - 3 and back > 1 and 0x80 <= line[back] < 0xC0:
            back -= 1
        if not 0x80 <= line[back] < 0xC0:  # a character starts there
            cut = back
        if line[cut - 1] == 0x0D and cut > 1:
            cut -= 1
        return cut


def lines_within(data: bytes, most: int) -> bool:
    """True if no line of data (which ends in b"\\n") is longer than `most`
    bytes.  One search per `most` bytes, none per line: each looks for the last
    newline within `most` + 1 bytes of the current line's start."""
    start = 0
    while len(data) - start > most + 1:
        newline = data.rfind(b"\n", start, start + most + 1)
        if newline < 0:
            return False
        start = newline + 1
    return True


# Lines encoded, and messages queued, in one go at most: a read of empty lines
# would otherwise become a quarter of a million messages at once.
ENCODE_LINES = 4096


def bounded_segments(segments: list, most: int) -> list:
    """segments, with every run of complete lines longer than `most` lines cut
    at line ends into runs of at most about `most` lines (a cut never falls
    inside a line; pieces of one over-long line pass as they are)."""
    out = []
    for seg in segments:
        lines = seg.lines
        if len(lines) <= most or not seg.strip_cr or lines.count(b"\n") <= most:
            out.append(seg)
            continue
        start, step = 0, max(1, len(lines) * most // lines.count(b"\n"))
        while start < len(lines):
            end = lines.rfind(b"\n", start, start + step) + 1
            if end <= start:
                end = lines.index(b"\n", start) + 1
            elif lines.count(b"\n", start, end) > most:
                step = max(1, step // 2)
                continue
            out.append(Segment(lines[start:end]))
            start = end
    return out


# Joining (--multiline, README "Multi-line events"): between framing and
# encoding, lines become events.  A rule tells, for each line, whether it
# begins an event (begins), and, while an event is pending, whether it
# continues it (follows); the Joiner holds the pending event and emits runs of
# plain lines (bytes, as the framer made them) and joined events.  A preset
# rule's scan() finds, in C passes over a run of lines, the first line that
# may matter: the lines before it cost no Python step of their own.  Each
# preset also names its triggers for Presets' one shared scan: line_starts
# (regular expressions a line that begins or continues its trace starts
# with), ruby's line_end, and tail() where the last lines of a run may begin
# what the next run continues.

CONTINUE, TENTATIVE, LAST = range(3)  # what a line does to the pending event (see follows)
# ------------------------------------------------------- multi-line rules --
# Owns what a trace looks like: the presets (one rule class per runtime, written from
# what the runtimes print), Presets (several at once), PatternRule (--multiline-pattern).

_INDENT = (0x20, 0x09)  # a line that starts with these is indented


def _blank(line: bytes) -> bool:
    return line in (b"", b"\r")


def _line_start(chunk: bytes, at: int, pos: int) -> int:
    """The start of the line of chunk that holds index at (not before pos)."""
    return max(pos, chunk.rfind(b"\n", pos, at) + 1)


def _first_found(chunk: bytes, pos: int, needles: tuple) -> int:
    """The start of the first line at or after pos that holds one of needles,
    or -1."""
    found = [at for at in (chunk.find(n, pos) for n in needles) if at >= 0]
    return _line_start(chunk, min(found), pos) if found else -1


MESSAGE_LINES = 20  # at most this many lines of a message between its head and frames
MAX_STACK = 200  # node: at most this many lines between 'FILE:LINE' and "Node.js vN"


@functools.lru_cache(maxsize=1)
def record_header() -> re.Pattern:
    """A line that begins with a timestamp or a logging framework's record
    header (a digit, "[" and a digit, a syslog PRI, a month's name, Ruby
    Logger's "E, [", an upper-case level word, "PHP Warning", a JSON object):
    it ends the lines that follow an exception line (README
    "Multi-line events").  Compiled once, when a preset first needs it."""
    return re.compile(
        rb'[0-9]|\[[0-9]|<[0-9]{1,3}>|[DIWEFAU], \[|\{"'
        rb"|(?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) [ 0-9][0-9]"
        rb"|(?:TRACE|DEBUG|INFO|NOTICE|WARN|WARNING|ERROR|CRITICAL|FATAL|SEVERE|PHP [A-Z])\b")


def _head_above(chunk: bytes, pos: int, at: int, head: re.Pattern, record: re.Pattern,
                *, blanks: bool = False) -> int:
    """The start of the nearest line above the one that starts at `at` (and not
    before pos) that head matches, when at most MESSAGE_LINES lines lie
    between them and none of them is a record line (nor blank, unless
    blanks); else -1."""
    for _ in range(MESSAGE_LINES + 1):
        if at <= pos:
            return -1
        start = _line_start(chunk, at - 1, pos)
        if head.match(chunk, start, at - 1):
            return start
        if (start == at - 1 and not blanks) or record.match(chunk, start, at - 1):
            return -1
        at = start
    return -1


def _message_line(line: bytes, record: re.Pattern) -> bool:
    """Whether line can be a later line of an exception's message: neither
    blank nor a record line."""
    return not _blank(line) and record.match(line) is None


class PythonRule:
    """CPython's report of an exception (traceback.print_exception): a line
    "Traceback (most recent call last):" (or "  + Exception Group Traceback
    ...", or a SyntaxError's '  File "...", line N') begins an event; indented
    lines continue it, and the first line that is not indented (the exception
    line) too, and after it every line up to a blank line or a record line
    (the message's later lines, notes); a blank line followed by "During
    handling of the above exception, another exception occurred:" or "The
    above exception was the direct cause of the following exception:" (or
    that line right after the exception's, as journald keeps it) continues it
    with the next traceback.  The runtime's own line before a traceback
    ("Exception in thread NAME:", "Exception ignored in: ...") begins its
    event.  A stack without an exception (logging's stack_info "Stack (most
    recent call last):", traceback.print_stack()'s '  File "...", line N, in
    f' lines, faulthandler's "Fatal Python error: ..." and "Current thread
    0x... (most recent call first):" blocks) is one event of its indented
    lines.  asyncio's record "... exception was never retrieved" and its
    "future: <...>" line are one event (the traceback after it its own, as
    after any logging record)."""

    FRAMES, GROUP, EXCEPTION, CHAINING, CHAINED, HEADER, STACK, FATAL, RECORD = range(9)
    # see Presets.scan; a traceback's or stack's own line follows the other first lines
    line_starts = (rb"Traceback \(most recent call last\):", rb'  File "',
                   rb"[ \t]*\+ Exception Group ", rb"future: <", rb"Fatal Python error: ")
    _needles = (b"Traceback (most recent call last):", b'  File "', b"Exception in thread ",
                b"Exception ignored in: ", b"exception was never retrieved",
                b"Stack (most recent call ", b"Fatal Python error: ", b"hread 0x")
    _chain = (b"During handling of the above exception, another exception occurred:",
              b"The above exception was the direct cause of the following exception:")

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._begin = re.compile(
            rb"(Traceback \(most recent call last\):|  File \".*\", line \d+"
            rb"|[ \t]*\+ Exception Group Traceback \(most recent call last\):)\r?$")
        self._header = re.compile(rb'Exception in thread [^"].*:\r?$|Exception ignored in: ')
        self._stack = re.compile(rb'  File ".*", line \d+, in |Stack \(most recent call ')
        self._threads = re.compile(rb"(?:Current thread|Thread) 0x[0-9a-f]+ \(most recent call "
                                   rb"first\):\r?$|Stack \(most recent call first\):\r?$")
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        return _first_found(chunk, pos, self._needles)

    def begins(self, line: bytes):
        match = self._begin.match(line)
        if match is not None:
            return self.GROUP if b"+ Exception Group" in match[1] else self.FRAMES
        if self._header.match(line):
            return self.HEADER
        if self._stack.match(line) or self._threads.match(line):
            return self.STACK
        if line.startswith(b"Fatal Python error: "):
            return self.FATAL
        return self.RECORD if line.rstrip(b"\r").endswith(b"exception was never retrieved") \
            else None

    def follows(self, state: int, line: bytes):
        if state >= self.HEADER:
            return self._outside_traceback(state, line)
        if state >= self.CHAINING:
            return self._chaining(state, line)
        if _blank(line):
            return None if state == self.FRAMES else (TENTATIVE, self.CHAINING)
        if state == self.EXCEPTION:
            return self._after_exception(line)
        return self._in_frames(state, line)

    def _chaining(self, state: int, line: bytes):
        """follows() after the blank line after an exception line (CHAINING),
        and after the line that chains the next traceback (CHAINED)."""
        if state == self.CHAINING:
            return (CONTINUE, self.CHAINED) if line.rstrip(b"\r") in self._chain else None
        if _blank(line):
            return CONTINUE, state
        begun = self.begins(line)
        return None if begun is None or begun > self.GROUP else (CONTINUE, begun)

    def _outside_traceback(self, state: int, line: bytes):
        """follows() after a line that announces a traceback, in a stack
        without an exception, and after asyncio's record."""
        if state == self.HEADER:
            begun = self._begin.match(line)
            return None if begun is None else (CONTINUE, self.begins(line))
        if state == self.RECORD:
            return (LAST, state) if line.startswith(b"future: <") else None
        if _blank(line):
            return TENTATIVE, self.FATAL
        if state == self.STACK and line[0] in _INDENT:
            return CONTINUE, state
        if state == self.FATAL and (self._threads.match(line)
                                    or line.startswith(b"Extension modules: ")):
            return CONTINUE, self.STACK
        return None

    def _in_frames(self, state: int, line: bytes):
        """follows() for a line that is not blank, in FRAMES or GROUP."""
        if line[0] in _INDENT:
            return CONTINUE, state
        if state == self.FRAMES and not self._begin.match(line):
            return CONTINUE, self.EXCEPTION
        return None

    def _after_exception(self, line: bytes):
        """follows() for a line that is not blank after the exception line."""
        if line.rstrip(b"\r") in self._chain:
            return CONTINUE, self.CHAINED
        if line.startswith(b"Stack (most recent call last):"):  # logging's stack_info
            return CONTINUE, self.STACK
        if self._record.match(line) or self._begin.match(line):
            return None
        return CONTINUE, self.EXCEPTION


class JavaRule:
    """The JVM's report of a Throwable (printStackTrace, an uncaught exception,
    a logging framework's): a line naming it, 'Exception in thread "NAME" '
    and a class name, or a dotted class name alone, either followed by ":
    message" or nothing, begins an event if lines follow that start with a
    tab or spaces and "at ", "... N more", "Suppressed: " or "Caused by: ",
    or with "Caused by: "; those continue it, and so do the lines of the
    message between (not blank, not record lines).  Such lines after any
    other line begin an event of their own.  java.util.logging's record at
    SEVERE or WARNING, a line "Nov 27, 2026 2:54:59 AM CLASS METHOD" and the
    "LEVEL: message" line after it, is one event."""

    HEAD, TRACE, JUL, MESSAGE = range(4)  # MESSAGE + n: n + 1 lines of the message
    line_starts = (rb"\t", rb" +(?:at |\.\.\. |Suppressed: |Caused by: )", rb"Caused by: ",
                   rb"SEVERE: ", rb"WARNING: ")
    # scan() passes over a head that no frame follows in the chunk: right for
    # one stream of lines, not for lines of several sources (see ObjectView).
    scans_one_stream = True

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._head = re.compile(rb'(?:Exception in thread "[^"]*" [\w$.]+|[A-Za-z_$][\w$]*'
                                rb'(?:\.[A-Za-z_$][\w$]*)+|[A-Za-z_]\w*(?:\$[\w$]+)+)'
                                rb'(?:: .*)?\r?$')  # Outer$Inner: the default package
        self._frame = re.compile(rb"[ \t]+(?:at |\.\.\. \d+ (?:more|common frames omitted)"
                                 rb"|Suppressed: |Caused by: )|Caused by: ")
        self._cause = re.compile(rb"[ \t]*(?:Caused by|Suppressed): ")
        self._jul = re.compile(rb"[A-Z][a-z]{2} \d\d?, \d{4} \d\d?:\d\d:\d\d [AP]M \S")
        self._jul_level = re.compile(rb"(?:SEVERE|WARNING): ")  # as scan() finds them
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        if chunk[pos:pos + 1] == b"\t":
            return pos
        tab = chunk.find(b"\n\t", pos)
        found = [self._above(chunk, pos, at) for at in (
            tab + 1 if tab >= 0 else -1, chunk.find(b"Caused by: ", pos),
            chunk.find(b"    at ", pos)) if at >= 0]
        for level in (b"\nSEVERE: ", b"\nWARNING: "):  # a JUL record's second line
            at = chunk.find(level, pos)
            if at >= 0:
                found.append(_line_start(chunk, at, pos))
        found.append(self.tail(chunk, pos))
        return min((at for at in found if at >= 0), default=-1)

    def tail(self, chunk: bytes, pos: int) -> int:
        """Where an event may begin among chunk's last lines that the next
        chunk's frames (or JUL level line) may continue, or -1."""
        last = _line_start(chunk, len(chunk) - 1, pos)  # a JUL header its level line follows
        if self._jul.match(chunk, last, len(chunk) - 1):
            return last
        return _head_above(chunk, pos, len(chunk), self._head, self._record)

    def _above(self, chunk: bytes, pos: int, at: int) -> int:
        """Where an event with the continuation line that holds `at` may begin:
        its head's line, else the line before it."""
        line = _line_start(chunk, at, pos)
        head = _head_above(chunk, pos, line, self._head, self._record)
        return head if head >= 0 else _line_start(chunk, line - 1, pos) if line > pos else line

    def begins(self, line: bytes):
        if self._frame.match(line):
            return self.TRACE
        if self._head.match(line):
            return self.HEAD
        return self.JUL if self._jul.match(line) else None

    def follows(self, state: int, line: bytes):
        if state == self.JUL:
            return (LAST, state) if self._jul_level.match(line) else None
        if self._frame.match(line):  # a cause's message may have later lines too
            return CONTINUE, self.HEAD if self._cause.match(line) else self.TRACE
        if state == self.TRACE or state >= self.MESSAGE + MESSAGE_LINES - 1 \
                or not _message_line(line, self._record) or self._head.match(line):
            return None
        return TENTATIVE, self.MESSAGE if state == self.HEAD else state + 1


class GoRule:
    """The Go runtime's report of a panic or fatal error: a line starting with
    "panic: ", "fatal error: " or "runtime: goroutine stack exceeds " (a stack
    overflow's), or the line net/http logs for a panic it recovered ("...
    http: panic serving ..."), begins an event; lines starting with a tab, "[signal ",
    "runtime: ", "fatal error: ", "goroutine N [...]:" and "runtime stack:"
    continue it, and in a goroutine's stack its function lines ("main.main()",
    "created by ..."); blank lines continue it when such a line follows them,
    and so do a panic value's later lines (not record lines) when the stack
    follows them.  A goroutine's stack alone ("goroutine N [running]:",
    runtime/debug.PrintStack()) begins an event too."""

    PANIC, STACK, MESSAGE = range(3)  # MESSAGE + n: n + 1 later lines of the panic value
    # net/http's record's own line may hold "panic" anywhere: the line after it starts so
    line_starts = (rb"panic: ", rb"fatal error: ", rb"runtime: ", rb"\t", rb"\[signal ",
                   rb"goroutine ")

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._overflow = b"runtime: goroutine stack exceeds "
        self._begin = re.compile(rb"panic: |fatal error: |" + self._overflow
                                 + rb"|[^\n]*?http: panic serving ")
        self._more = re.compile(rb"\t|\[signal |runtime: |fatal error: ")
        self._block = re.compile(rb"goroutine \d+ .*\]:\r?$|runtime stack:\r?$")
        self._function = re.compile(
            rb"[^\s(]+\(.*\)\r?$|created by |\.\.\.additional frames elided")
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        return _first_found(chunk, pos, (b"panic", b"fatal error: ", self._overflow,
                                         b"goroutine "))

    def begins(self, line: bytes):
        if self._begin.match(line):
            return self.PANIC
        return self.STACK if self._block.match(line) else None

    def follows(self, state: int, line: bytes):
        if _blank(line):
            return TENTATIVE, state
        if self._more.match(line):
            return CONTINUE, self.PANIC if state >= self.MESSAGE else state
        if self._block.match(line):
            return CONTINUE, self.STACK
        if state == self.STACK:
            return (CONTINUE, state) if self._function.match(line) else None
        if state >= self.MESSAGE + MESSAGE_LINES - 1 or self._record.match(line):
            return None
        return TENTATIVE, self.MESSAGE if state == self.PANIC else state + 1


class RubyRule:
    """Ruby's report of an uncaught exception: 'FILE:LINE:in `METHOD': message
    (Class)' begins an event; the lines after it up to its first frame that
    are not record lines continue it (a message's later lines, error_highlight's
    source line and carets, "Did you mean?"; a blank line among them when one
    such line follows); lines starting with a tab and "from FILE:LINE:" or
    "... N levels..." continue it, and so does a cause's own first line.
    Logger's record of an exception at ERROR or FATAL ('E, [TIME #PID] ERROR
    -- PROG: message (Class)', or any record line ending so: another
    formatter's) begins an event that its backtrace's lines ('FILE:LINE:in
    `METHOD'') continue, and the message's later lines before them; an
    uncaught exception's first line after a record line that does not end
    with its class begins an event of its own.  A thread's report
    ('#<Thread:...> terminated with exception ...:') begins the event of the
    exception's report after it."""

    MESSAGE, FRAMES, LOGGED, BACKTRACE = range(4)
    line_starts = (rb"\t", rb"[EF], \[")  # a thread's report: the report's line follows
    line_end = rb"\)\r?\n"  # an uncaught exception's first line ends with its class
    scans_one_stream = True  # a Logger record may begin what the next chunk continues

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._begin = re.compile(rb"[^\s:][^:]*:\d+:in [`'].*\)\r?$")  # one place: linear
        self._from = re.compile(rb"\t+(?:from \S.*?:\d+:in | ?\.\.\. \d+ levels\.\.\.)")
        self._logged = re.compile(rb"[EF], \[[^\]]*\] +[A-Z]+ -- [^:]*: ")
        self._backtrace = re.compile(rb"[^\s:][^:]*:\d+:in [`']")
        self._thread = re.compile(rb"#<Thread:[^>]*> terminated with exception ")
        self._class = re.compile(rb" \([A-Z][\w:]*\)\r?$")  # a record of another layout
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        found = _first_found(chunk, pos, (b":in ", b"] ERROR -- ", b"] FATAL -- ", b"#<Thread:"))
        if found < 0:  # a record whose backtrace the next chunk may hold
            found = _line_start(chunk, len(chunk) - 1, pos)
            return found if self.begins(chunk[found:len(chunk) - 1]) is not None else -1
        above = _line_start(chunk, found - 1, pos) if found > pos else found
        return above if self.begins(chunk[above:found - 1]) == self.LOGGED else found

    def begins(self, line: bytes):
        if self._begin.match(line) or self._thread.match(line):
            return self.MESSAGE
        if self._logged.match(line) or (self._record.match(line) and self._class.search(line)):
            return self.LOGGED
        return None

    def follows(self, state: int, line: bytes):
        if state >= self.LOGGED:
            return self._after_record(state, line)
        if self._from.match(line) or self._begin.match(line):
            return CONTINUE, self.FRAMES if line[0] == 0x09 else self.MESSAGE
        if state == self.FRAMES or self._record.match(line):
            return None
        return (TENTATIVE if _blank(line) else CONTINUE), state

    def _after_record(self, state: int, line: bytes):
        """follows() after a Logger record."""
        if self._begin.match(line):  # an uncaught exception's report: its own event
            return None
        if self._backtrace.match(line):
            return CONTINUE, self.BACKTRACE
        if state == self.LOGGED and _message_line(line, self._record):
            return TENTATIVE, state
        return None


class PhpRule:
    """PHP's report of an exception (uncaught: "PHP Fatal error:  Uncaught
    ..."; or a Throwable's string, "Class: message in FILE:LINE"): a line
    ending " in FILE:LINE" or holding "Fatal error: Uncaught " begins an
    event if "Stack trace:" follows (after the message's later lines); the
    frames "#N ...", a blank line and "Next Class: ..." (a chained
    exception; journald keeps no blank line), and "  thrown in FILE on line N"
    (its last line) continue it."""

    HEAD, TRACE, NEXT, MESSAGE = range(4)  # MESSAGE + n: n + 1 lines of the message
    scans_one_stream = True
    line_starts = (rb"Stack trace:",)

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._uncaught = re.compile(rb".*Fatal error: +Uncaught ")
        self._head = re.compile(rb"(?:.*Fatal error: +Uncaught |.* in [^ ]*:\d+\r?$)")
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        found = [self.tail(chunk, pos)]
        trace = chunk.find(b"\nStack trace:", pos)
        if trace >= 0:
            head = self._above(chunk, pos, trace + 1)
            found.append(head if head >= 0 else trace + 1)
        return min((at for at in found if at >= 0), default=-1)

    def tail(self, chunk: bytes, pos: int) -> int:
        """Where an event may begin among chunk's last lines that the next
        chunk's "Stack trace:" may continue, or -1."""
        return self._above(chunk, pos, len(chunk))

    def _above(self, chunk: bytes, pos: int, line: int) -> int:
        """Where an event may begin whose "Stack trace:" line starts at `line`
        (or comes later): its "Fatal error: Uncaught" line, else its nearest
        head, else -1."""
        for head in (self._uncaught, self._head):
            found = _head_above(chunk, pos, line, head, self._record)
            if found >= 0:
                return found
        return -1

    def begins(self, line: bytes):
        return self.HEAD if self._head.match(line) else None

    def follows(self, state: int, line: bytes):
        if state == self.NEXT:
            return (CONTINUE, self.HEAD) if line.startswith(b"Next ") else None
        if line.startswith(b"Stack trace:"):
            return CONTINUE, self.TRACE
        if state == self.TRACE:
            return self._in_trace(line)
        if state >= self.MESSAGE + MESSAGE_LINES - 1 or not _message_line(line, self._record):
            return None
        return TENTATIVE, self.MESSAGE if state == self.HEAD else state + 1

    @staticmethod
    def _in_trace(line: bytes):
        if line.startswith(b"#"):
            return CONTINUE, PhpRule.TRACE
        if line.startswith(b"  thrown in "):
            return LAST, PhpRule.TRACE
        if line.startswith(b"Next "):  # without the blank line before it (journald)
            return CONTINUE, PhpRule.HEAD
        return (TENTATIVE, PhpRule.NEXT) if _blank(line) else None


class NodeRule:
    """Node.js's report of an error: uncaught (or a rejection), 'FILE:LINE'
    then the source line, a caret line, a blank line, what was thrown and
    its stack (blank lines in it too: assert's diff), a blank line and
    "Node.js vN"; or the error alone (console.error(err)): a line "Error:
    message" (any NameError, NameException, with " [CODE]"; console.trace()'s
    "Trace: message") begins an event if lines starting with spaces and "at "
    follow (after the message's later lines, blank ones too).  The stack's
    indented lines, "}" and "]" lines (a cause, the error's own properties)
    continue it."""

    HEAD, STACK, SOURCE, CARET, THROW, THROWN, AFTER, MESSAGE = range(8)
    # MESSAGE + n: n + 1 lines of the message
    scans_one_stream = True
    line_starts = (rb" +(?:at |\.\.\. \d+ lines? matching )", rb"Node\.js v")

    def __init__(self):
        """Compiles its expressions here: the plain mode never needs them."""
        self._where = re.compile(rb"(?:/|file:|node:|[A-Za-z]:\\)\S*:\d+\r?$")
        self._head = re.compile(rb"(?:(?:[A-Z][\w$]*)?(?:Error|Exception)(?: \[\w+\])?|Trace)"
                                rb"(?:: .*)?\r?$")  # Trace: console.trace()'s
        self._frame = re.compile(rb" +(?:at |\.\.\. \d+ lines? matching )")
        self._record = record_header()

    def scan(self, chunk: bytes, pos: int) -> int:
        frame = chunk.find(b"\n    at ", pos)
        found = [self._above(chunk, pos, frame + 1)] if frame >= 0 else []
        version = chunk.find(b"\nNode.js v", pos)
        if version >= 0:
            found.append(self._where_above(chunk, pos, version + 1))
        found.append(self.tail(chunk, pos))
        return min((at for at in found if at >= 0), default=-1)

    def tail(self, chunk: bytes, pos: int) -> int:
        """Where an event may begin among chunk's last lines that the next
        chunk's stack may continue (an error's, or an uncaught error's first
        lines), or -1."""
        found = [_head_above(chunk, pos, len(chunk), self._head, self._record, blanks=True),
                 self._where_above(chunk, pos, len(chunk), MESSAGE_LINES + 5)]
        return min((at for at in found if at >= 0), default=-1)

    def _above(self, chunk: bytes, pos: int, line: int) -> int:
        """Where the event with the frame line that starts at `line` may
        begin: an uncaught error's 'FILE:LINE' above its error line, else the
        error line, else the frame line."""
        head = _head_above(chunk, pos, line, self._head, self._record, blanks=True)
        if head < 0:
            return line
        where = self._where_above(chunk, pos, head, 5)
        return where if where >= 0 else head

    def _where_above(self, chunk: bytes, pos: int, at: int, most: int = MAX_STACK) -> int:
        """The start of the nearest 'FILE:LINE' line within `most` lines above
        the line that starts at `at` (none of them a record line), or -1."""
        for _ in range(most):
            if at <= pos:
                return -1
            start = _line_start(chunk, at - 1, pos)
            if self._where.match(chunk, start, at - 1):
                return start
            if self._record.match(chunk, start, at - 1):
                return -1
            at = start
        return -1

    def begins(self, line: bytes):
        if self._head.match(line):
            return self.HEAD
        return self.SOURCE if self._where.match(line) else None

    def follows(self, state: int, line: bytes):
        if state <= self.STACK or state >= self.MESSAGE:
            return self._in_error(state, line)
        if state == self.SOURCE:
            return None if self._record.match(line) else (TENTATIVE, self.CARET)
        if state == self.CARET:
            return (CONTINUE, self.THROW) if line and not line.strip(b" ^\r") else None
        if state == self.AFTER and line.startswith(b"Node.js v"):
            return LAST, state
        return self._thrown(state, line)

    def _thrown(self, state: int, line: bytes):
        """follows() after an uncaught error's caret line."""
        if _blank(line):
            return TENTATIVE, (state if state == self.THROW else self.AFTER)
        if self._frame.match(line) or (state == self.THROWN and line[:1] == b" "):
            return CONTINUE, self.THROWN
        return None if self._record.match(line) else (CONTINUE, self.THROWN)

    def _in_error(self, state: int, line: bytes):
        """follows() after an "Error: ..." line."""
        if self._frame.match(line) or (state == self.STACK and line[:1] in (b" ", b"}", b"]")):
            return CONTINUE, self.STACK
        if state == self.STACK or state >= self.MESSAGE + MESSAGE_LINES - 1 \
                or self._record.match(line):  # a blank line too: assert's diff has one
            return None
        return TENTATIVE, self.MESSAGE if state == self.HEAD else state + 1


PRESET_RULES = {"python": PythonRule, "java": JavaRule, "go": GoRule, "ruby": RubyRule,
                "php": PhpRule, "node": NodeRule}


class Presets:
    """Several preset rules at once: the first whose begins() takes a line
    owns the event it begins; the state is (rule, its state)."""

    def __init__(self, names: tuple):
        self._rules = [rule() for name, rule in PRESET_RULES.items() if name in names]
        self.scans_one_stream = any(getattr(rule, "scans_one_stream", False)
                                    for rule in self._rules)
        starts = b"|".join(dict.fromkeys(s for rule in self._rules for s in rule.line_starts))
        self._starts = re.compile(b"(?:%s)" % starts)
        self._later_starts = re.compile(b"\n(?:%s)" % starts)
        ends = [rule.line_end for rule in self._rules if hasattr(rule, "line_end")]
        self._ends = re.compile(b"|".join(ends)) if ends else None
        self._tails = [rule.tail for rule in self._rules if hasattr(rule, "tail")]

    def scan(self, chunk: bytes, pos: int) -> int:
        """The rules' scan() at once.  One shared pass finds whether a line
        at or after pos holds a trigger of any rule (a trace's first line, or
        a line that continues one: its start, or ruby's end); only then are
        the rules' own scan() run.  Without one, only chunk's last lines,
        that the next chunk may continue, are looked at: each rule's tail()
        and every rule's begins() of the last line."""
        if self._triggered(chunk, pos):
            found = [at for at in (rule.scan(chunk, pos) for rule in self._rules) if at >= 0]
            return min(found, default=-1)
        found = [at for at in (tail(chunk, pos) for tail in self._tails) if at >= 0]
        last = _line_start(chunk, len(chunk) - 1, pos)
        if self.begins(chunk[last:len(chunk) - 1]) is not None:
            found.append(last)
        return min(found, default=-1)

    def _triggered(self, chunk: bytes, pos: int) -> bool:
        """Whether a line at or after pos holds a trigger."""
        if self._starts.match(chunk, pos) or self._later_starts.search(chunk, pos):
            return True
        if self._ends is None:
            return False
        at = pos
        for _ in range(len(chunk)):  # each line ending so that ruby's first line may
            ended = self._ends.search(chunk, at)
            if ended is None:
                return False
            at = ended.end()  # ":in " on it, or on the next line (a record's backtrace)
            if chunk.find(b":in ", _line_start(chunk, ended.start(), pos),
                          chunk.find(b"\n", at)) >= 0:
                return True
        return False

    def begins(self, line: bytes):
        for rule in self._rules:
            state = rule.begins(line)
            if state is not None:
                return rule, state
        return None

    def follows(self, state: tuple, line: bytes):
        rule, inner = state
        step = rule.follows(inner, line)
        return None if step is None else (step[0], (rule, step[1]))


class PatternRule:
    """--multiline-pattern with Filebeat's negate and match: a line continues
    when the pattern is found in its first MULTILINE_MATCH_BYTES bytes (when
    it is not, with negate).  match after: a continuing line joins the event
    before it, and every other line begins one; match before: a continuing
    line begins or continues an event that the next other line ends.  Every
    line is tested: costlier than a preset."""

    def __init__(self, pattern: re.Pattern, negate: bool, after: bool):
        self._search = pattern.search
        self._negate = negate
        self._after = after

    def _continues(self, line: bytes) -> bool:
        return (self._search(line, 0, MULTILINE_MATCH_BYTES) is None) is self._negate

    @staticmethod
    def scan(chunk: bytes, pos: int) -> int:
        return pos

    def begins(self, line: bytes):
        return True if self._after or self._continues(line) else None

    def follows(self, state, line: bytes):
        if self._continues(line):
            return CONTINUE, state
        return None if self._after else (LAST, state)


def joining_rule(multiline: Multiline):
    """The rule that --multiline or --multiline-pattern names."""
    if multiline.pattern is not None:
        return PatternRule(multiline.pattern, multiline.negate, multiline.after)
    if len(multiline.presets) == 1:
        return PRESET_RULES[multiline.presets[0]]()
    return Presets(multiline.presets)


# ---------------------------------------------------------------- joining --
# Owns joining lines into multi-line events (--multiline): the items the stages pass
# (Joined events, ParsedLines), and the one Joiner with its view of a line: TextView,
# or ObjectView per source (--json, --journal, --docker, --cri).

class Joined:
    """An item of the reading pipeline: events a Joiner made, texts (lines
    joined by b"\\n"), for each whether it was cut at a cap (its rest follows
    in the next) and how many lines it came from; held: how many of those
    lines (the first ones) a stage held before (see Segment).  A plain class:
    a NamedTuple's creation would cost every start."""

    __slots__ = ("cut", "documents", "held", "lines", "texts")
    joins = True  # an item of events (a Segment's lines are each their own)

    def __init__(self, texts: list, cut: list, lines: list, held: int = 0,
                 documents: list | None = None):
        self.texts = texts
        self.cut = cut
        self.lines = lines
        self.held = held
        self.documents = documents  # per text its parse (see ParsedLines), or None

    def add(self, text: bytes, cut: bool, lines: int, held: int, document=None):
        """One more event, after the others."""
        self.texts.append(text)
        self.cut.append(cut)
        self.lines.append(lines)
        self.held += held
        if self.documents is not None:
            self.documents.append(document)

    def nlines(self) -> int:
        return sum(self.lines)

    def encoded(self, encoder, read_at: float) -> tuple:
        messages, events = encoder.encode_events(self.texts, self.cut, read_at, self.documents)
        return messages, events, [True] * len(messages)

    def split(self, lines: int) -> tuple:
        """Events are never split: (self, None), or (None, self) for 0 lines."""
        return (self, None) if lines else (None, self)


class ParsedLines(NamedTuple):
    """An item of the reading pipeline: a run of whole lines (CR stripped)
    whose JSON objects a stage parsed already (--json, --journal per source):
    documents[i] is line i's (text, object, end, whole) or None, as
    JsonEncoder.encode_parsed takes them, so that no line is parsed twice."""

    lines: bytes
    documents: list
    held: int = 0
    joins = False
    continues = False

    def nlines(self) -> int:
        return len(self.documents)

    def encoded(self, encoder, read_at: float) -> tuple:
        messages, events = encoder.encode_parsed(self.lines, self.documents, read_at)
        return messages, events, [True] * len(messages)

    def split(self, lines: int) -> tuple:
        """(its first `lines` lines, the rest), either None when empty."""
        cut = lines_end(self.lines, lines)
        first = (ParsedLines(self.lines[:cut], self.documents[:lines], min(self.held, lines))
                 if cut else None)
        rest = (ParsedLines(self.lines[cut:], self.documents[lines:],
                            max(0, self.held - lines)) if cut < len(self.lines) else None)
        return first, rest


class _ItemList:
    """Builds a stage's output: runs of whole lines gathered into Segments,
    events gathered into Joined items, in order."""

    __slots__ = ("_documents", "_items", "_joined", "_run", "_run_held")

    def __init__(self):
        self._items: list = []
        self._run: list = []
        self._run_held = 0
        self._documents: list | None = None
        self._joined: Joined | None = None

    def lines(self, lines: bytes, held: int, documents: list | None = None):
        """Whole lines, each its own event; held: how many were held before;
        documents: their parses (see ParsedLines), given for every run or none."""
        self._run.append(lines)
        self._run_held += held
        if documents is not None:
            self._documents = documents if self._documents is None \
                else self._documents + documents

    def event(self, text: bytes, cut: bool, lines: int, held: int, document=None):
        """A joined event of `lines` lines, `held` of them held before;
        document: its parse (see ParsedLines), None if none."""
        self._end_run()
        if self._joined is not None:
            self._joined.add(text, cut, lines, held, document)
        else:
            self._joined = Joined([text], [cut], [lines], held, [document])
            self._items.append(self._joined)

    def items(self) -> list:
        """The items built so far; the list starts again empty."""
        self._end_run()
        items, self._items, self._joined = self._items, [], None
        return items

    def _end_run(self):
        if self._run:
            run = self._run[0] if len(self._run) == 1 else b"".join(self._run)
            if self._documents is None:
                self._items.append(_new_tuple(Segment, (run, False, False, self._run_held)))
            else:
                self._items.append(ParsedLines(run, self._documents, self._run_held))
            self._run, self._run_held, self._documents, self._joined = [], 0, None, None


class _Pending:
    """One source's pending event in a Joiner: the records of its lines (what
    the view keeps of each), their size as the rule saw them, the rule's
    state, the tentative lines whose fate the next line decides (record and
    what the rule saw), when its last line came (the clock's time), and how
    many of its lines a call before this one took (old, as of call)."""

    __slots__ = ("call", "last", "old", "records", "size", "state", "tentative",
                 "tentative_size")

    def __init__(self):
        """None yet: the Joiner sets records, size, state, last, old and call
        when an event begins (an ended _Pending is used again)."""
        self.tentative: list = []
        self.tentative_size = 0

    def count(self) -> int:
        return len(self.records) + len(self.tentative)


class TextView:
    """A Joiner's view of text lines (--multiline): the rule sees each line
    itself, all lines are one source, a line is its own record."""

    caps = None  # no cap beyond the Joiner's own per event
    scan_of = None  # the rule's scan() as it is

    @staticmethod
    def seen(chunk: bytes, documents: list | None = None) -> tuple:
        """(what the rule sees of chunk's lines, one line each; their records,
        or None where a record is the line seen).  Text has no documents."""
        return chunk, None

    @staticmethod
    def run(out: _ItemList, chunk: bytes, records, first: int, last: int, *,
            start: int, end: int):
        """Lines first to last (seen[start:end]) leave as they came."""
        out.lines(chunk[start:end] if start or end < len(chunk) else chunk, 0)

    @staticmethod
    def lines(records: list, held: int, out: _ItemList, cut: bool = False):
        """records leave as lines of their own (cut: each a cut event)."""
        if cut:
            for record in records:
                out.event(record, True, 1, held > 0)
                held -= held > 0
            return
        out.lines(b"\n".join(records) + b"\n", held)

    @staticmethod
    def event(records: list, cut: bool, held: int, out: _ItemList) -> bool:
        """records leave as one event; False if they cannot (then as lines).
        A cut event ends with the newline after its last line (see Joiner)."""
        text = b"\n".join(records)
        out.event(text + b"\n" if cut else text, cut, len(records), held)
        return True

    @staticmethod
    def raw(record) -> bytes:
        return record

    @staticmethod
    def done(firsts: list = ()):
        """The end of a call to feed(); firsts: the pending events' first records."""


class Joiner:
    """Groups complete lines into events by a rule, as a view sees them:
    TextView, the lines themselves, or ObjectView, the messages of JSON
    objects per source (--json, --journal).  A line is joined only with
    lines of its own source; per source it holds at most one pending event
    (at most max_lines lines and max_bytes bytes as the rule sees them: past
    either it is cut and the rest goes on in a new event) and the blank lines
    whose fate the next line decides.  A view with caps (ObjectView) also
    bounds all sources together: past its caps (sources pending, bytes held)
    the pending event that began first leaves whole, marked as cut, counted
    in events_pushed_out.

    feed(), flush() and flush_quiet() return, in the order events complete,
    the pipeline's items: Segments or ParsedLines (runs of whole lines, each
    its own event) and Joined events; an event of one line leaves as a line.
    Each item says how many of its lines were held before the call (see
    Segment.held): per source, what the Joiner holds is always its newest
    lines, and leaves oldest first.  Counts the events and lines joined and
    the events cut.  clock() (the loop's time) stamps each source's last
    line, for the quiet timer (quiet_at).

    An event cut (at a cap, or pushed out) ends with the newline after its
    last line: its message and the next one of its source, concatenated, give
    back the lines as they came, as the pieces of a line cut at
    --max-line-bytes do ("@continues" has that one meaning)."""

    def __init__(self, rule, max_lines: int, max_bytes: int, counters: Counters,
                 *, clock=time.monotonic, view=TextView):
        self._rule = rule
        self._max_lines = max_lines
        self._max_bytes = max_bytes
        self._counters = counters
        self.clock = clock  # what the times of flush_quiet() are read on
        self._view = view
        self._scan = view.scan_of(rule) if view.scan_of else rule.scan
        self._pending: dict = {}  # source: _Pending, in the order their events began
        self._spare: _Pending | None = None  # one that ended, to begin the next with
        self._caps = view.caps
        self._call = 0  # feed(), flush() and flush_quiet() calls so far
        self._lines = 0  # lines held, by all sources
        self._held_bytes = 0  # with caps: what the view counts of them
        self._out = _ItemList()

    def pending(self) -> int:
        """Lines held, by all sources."""
        return self._lines

    def holding(self) -> list:
        """The lines held (as they came, without newline), oldest first."""
        raw = self._view.raw
        if not self._pending:
            return []
        if len(self._pending) == 1:
            (p,) = self._pending.values()
            return [raw(r) for r in p.records] + [raw(r) for r, _ in p.tentative]
        records = [r for p in self._pending.values()
                   for r in p.records + [t for t, _ in p.tentative]]
        return [raw(r) for r in sorted(records, key=self._view.order)]

    def feed(self, chunk: bytes, documents: list | None = None) -> list:
        """The output of chunk (whole lines, CR before newline already stripped
        where it is to be; documents: their parses, see ParsedLines, if a
        stage made them).  While no source has an event pending, the rule's
        scan() over what the view sees of the lines finds the first that may
        begin one: the lines before it leave as they came, in one run."""
        self._call += 1
        out, now, view, scan = self._out, self.clock(), self._view, self._scan
        seen, records = view.seen(chunk, documents)
        pos, size, index = 0, len(seen), 0
        while pos < size:
            if not self._pending:
                found = scan(seen, pos)
                if found < 0:
                    found = size
                if found > pos:
                    count = 0 if records is None else seen.count(b"\n", pos, found)
                    view.run(out, chunk, records, index, index + count, start=pos, end=found)
                    index += count
                    pos = found
                    continue
            end = seen.index(b"\n", pos)
            line = seen[pos:end]
            if records is None:
                self._take(None, line, line, now, out)
            else:
                record = records[index]
                if view.ends(record):  # it ends its source's event, leaves as a line
                    self._flush_source(view.source(record), out)
                    view.lines([record], 0, out)
                else:
                    self._take(view.source(record), line, record, now, out)
            index += 1
            pos = end + 1
        view.done([p.records[0] for p in self._pending.values() if p.records])
        return out.items()

    def flush(self) -> list:
        """Every pending event and held line, emitted now, the oldest first."""
        self._call += 1
        for source in list(self._pending):
            self._flush_source(source, self._out)
        return self._out.items()

    def quiet_at(self, timeout: float) -> float | None:
        """When the first source with an event pending is quiet for timeout
        (clock's time), or None if none is pending."""
        if not self._pending:
            return None
        return min(p.last for p in self._pending.values()) + timeout

    def flush_quiet(self, now: float, timeout: float) -> list:
        """The pending events of sources whose last line came at or before
        now - timeout."""
        self._call += 1
        for source, p in list(self._pending.items()):
            if p.last + timeout <= now:
                self._flush_source(source, self._out)
        return self._out.items()

    def _touch(self, p: _Pending) -> _Pending:
        """p, its old count made right for this call."""
        if p.call != self._call:
            p.call, p.old = self._call, p.count()
        return p

    def _take(self, source, line: bytes, record, now: float, out: _ItemList):
        """One line (as the rule sees it; record: what the view keeps of it)."""
        p = self._pending.get(source)
        if p is not None:
            if p.call != self._call:
                self._touch(p)
            step = self._rule.follows(p.state, line)
            if step is not None:
                action, p.state = step
                p.last = now
                self._follow(source, p, action, (record, line), out)
                return
            self._end(source, p, out)
        state = self._rule.begins(line)
        if state is None:
            self._view.lines([record], 0, out)
            return
        p, self._spare = self._spare or _Pending(), None
        p.records, p.size, p.state, p.last, p.old, p.call = (
            [record], len(line), state, now, 0, self._call)
        self._pending[source] = p
        self._lines += 1
        if self._caps is not None:
            self._hold_capped(record, out)

    def _follow(self, source, p: _Pending, action: int, entry: tuple, out: _ItemList):
        """A line that the rule says follows p's event: entry is (its record,
        what the rule saw), action what it does to the event."""
        record, line = entry
        if action == TENTATIVE:
            if self._holds_too_much(p, line):
                self._end(source, p, out)  # the held lines go on their own
                self._view.lines([record], 0, out)
                return
            p.tentative.append(entry)
            p.tentative_size += 1 + len(line)
            self._hold(record, out)
            return
        if p.tentative:
            tentative, p.tentative, p.tentative_size = p.tentative, [], 0
            for held, seen in tentative:
                self._append(p, held, seen, out)
        self._append(p, record, line, out)
        if action == LAST:
            self._end(source, p, out)
        self._hold(record, out)

    def _holds_too_much(self, p: _Pending, line: bytes) -> bool:
        """Whether holding line too would pass a cap with the pending event."""
        return (len(p.records) + len(p.tentative) >= self._max_lines
                or p.size + p.tentative_size + 1 + len(line) > self._max_bytes)

    def _append(self, p: _Pending, record, line: bytes, out: _ItemList):
        """Add a line (held already) to p's event, cutting it first at a cap."""
        if len(p.records) >= self._max_lines or p.size + 1 + len(line) > self._max_bytes:
            self._counters.events_cut += 1
            self._emit(p, out, cut=True)
            p.records, p.size = [record], len(line)
            return
        p.records.append(record)
        p.size += 1 + len(line)

    def _hold(self, record, out: _ItemList):
        """record is held (or was, if its event left already)."""
        self._lines += 1
        if self._caps is not None:
            self._hold_capped(record, out)

    def _hold_capped(self, record, out: _ItemList):
        """With the view's caps, record's bytes are held: push out the events
        that began first while the sources pending or the bytes held are past
        them."""
        caps = self._caps
        self._held_bytes += self._view.cost(record)
        while self._pending and (len(self._pending) > caps[0] or self._held_bytes > caps[1]):
            self._flush_source(next(iter(self._pending)), out, pushed_out=True)

    def _released(self, records: list):
        self._lines -= len(records)
        if self._caps is not None:
            self._held_bytes -= sum(map(self._view.cost, records))

    def _flush_source(self, source, out: _ItemList, pushed_out: bool = False):
        p = self._pending.get(source)
        if p is not None:
            self._touch(p)
            self._end(source, p, out, pushed_out)

    def _end(self, source, p: _Pending, out: _ItemList, pushed_out: bool = False):
        """p's event and tentative lines leave; the source has none pending."""
        del self._pending[source]
        self._emit(p, out, pushed_out=pushed_out)
        self._spare = p

    def _held(self, p: _Pending, lines: int) -> int:
        """How many of p's next `lines` lines emitted were held before the call."""
        held = min(lines, p.old)
        p.old -= held
        return held

    def _emit(self, p: _Pending, out: _ItemList, cut: bool = False, pushed_out: bool = False):
        """Emit p's event (cut: its rest follows), then, unless cut, its
        tentative lines as lines of their own; pushed_out (past the view's
        caps, unfinished): each marked as a cut event and counted."""
        records, view, counters = p.records, self._view, self._counters
        if len(records) == 1 and not (cut or pushed_out or p.tentative):  # the common case
            self._lines -= 1
            if self._caps is not None:
                self._held_bytes -= view.cost(records[0])
            held = 1 if p.old else 0
            p.old -= held
            view.lines(records, held, out)
            p.records = []
            return
        self._released(records)
        if len(records) > 1 or (records and (cut or pushed_out)):
            joined = len(records) > 1
            if joined:
                counters.events_joined += 1
                counters.lines_joined += len(records)
            done = view.event(records, cut or pushed_out, self._held(p, len(records)), out)
            counters.events_pushed_out += pushed_out
            if joined and not done:  # left line by line: not counted as joined
                counters.events_joined -= 1
                counters.lines_joined -= len(records)
        elif records:
            view.lines(records, self._held(p, 1), out)
        p.records, p.size = [], 0
        if not cut and p.tentative:
            tentative = [record for record, _ in p.tentative]
            self._released(tentative)
            view.lines(tentative, self._held(p, len(tentative)), out, pushed_out)
            counters.events_pushed_out += pushed_out * len(tentative)
            p.tentative, p.tentative_size = [], 0


# Joining per source (--multiline with --json or --journal, README "Multi-line
# events"): the rule sees each line's message, and each source (the values of
# --multiline-source's keys; lines that are not JSON objects one source of their
# own) has an event of its own pending.
_TEXT_SOURCE = ("text",)  # the source of lines that are not JSON objects (no key tuple is)
# An ObjectView record: (raw line, message (None: not an object), document (see
# ParsedLines), source, what the rule sees is None (an object without a message),
# sequence number).
_RAW, _MESSAGE, _DOCUMENT, _SOURCE, _ENDS, _SEQUENCE = range(6)
_MESSAGE_OF = operator.itemgetter(_MESSAGE)


def _one_stream_scan(rule):
    """The scan() a rule gives for lines of several sources: its own unless
    it is right only for one stream (java's): then every line is looked at."""
    return PatternRule.scan if getattr(rule, "scans_one_stream", False) else rule.scan


class ObjectView:
    """A Joiner's view of JSON lines (--json, --journal): the rule sees an
    object's message (--json: the string of message_key, else of "message";
    --journal: MESSAGE) with its own newlines as spaces, a line that is not
    an object its text; the source is the values of keys (lines that are
    not objects one source of their own).  Each line is parsed once here:
    its parse goes with it to the encoder (see ParsedLines) unless a later
    call emits it (held lines keep no parse, the memory bound, but for the
    first line of each pending event, whose object the joined event is).

    A joined event of objects is the first line's object with its message
    replaced by the messages joined by "\\n", as one JSON line (the other
    lines' fields are dropped); of other lines, the lines joined by b"\\n"
    (see JsonEncoder.encode_events).  An object whose message is not a
    string ends its source's pending event and leaves as a line; so do, line
    by line, the lines of an event whose first object cannot be written
    again as JSON (a lone surrogate, a number out of range, nesting too
    deep).  Events of different sources may leave in another order than
    their first lines came in.  Caps: MULTILINE_SOURCES sources pending,
    MULTILINE_SOURCE_BYTES held (each line counted with
    MULTILINE_LINE_OVERHEAD)."""

    caps = (MULTILINE_SOURCES, MULTILINE_SOURCE_BYTES)
    scan_of = staticmethod(_one_stream_scan)
    order = operator.itemgetter(_SEQUENCE)
    source = operator.itemgetter(_SOURCE)
    ends = operator.itemgetter(_ENDS)
    raw = operator.itemgetter(_RAW)

    def __init__(self, keys: tuple, message_key: str | None = None, journal: bool = False):
        self._keys = keys
        self._journal = journal
        self._message_key = "MESSAGE" if journal else message_key or "message"
        self._sequence = 0
        self._call_records: list = []  # the records of the chunk being fed

    def seen(self, chunk: bytes, documents: list | None = None) -> tuple:
        """(what the rule sees of chunk's lines, one line each; their records).
        documents: the lines' parses if a stage made them (see ParsedLines)."""
        lines = chunk.split(b"\n")
        lines.pop()
        first = self._sequence
        self._sequence += len(lines)
        self.done()
        records = self._call_records = (
            self._records(chunk, lines, first) if documents is None
            else list(map(self._parsed_record, lines, documents, itertools.count(first))))
        if None not in map(_MESSAGE_OF, records):  # the common case: objects with messages
            seen = "\n".join(map(_MESSAGE_OF, records))
            if seen.count("\n") >= len(records):  # a message's own newlines: seen as spaces
                seen = "\n".join([r[_MESSAGE].replace("\n", " ") for r in records])
            return seen.encode("utf-8", "surrogatepass") + b"\n", records
        seen = b"\n".join([b"" if r[_ENDS] else r[_RAW] if r[_MESSAGE] is None else
                           r[_MESSAGE].encode("utf-8", "surrogatepass").replace(b"\n", b" ")
                           for r in records])
        return seen + b"\n", records

    def _records(self, chunk: bytes, lines: list, first: int) -> list:
        """The records of lines (chunk), their sequence numbers from first on.
        Each line is parsed once: all in one go by the C scanner, up to the
        first it refuses; that one and the rest line by line."""
        try:
            texts = chunk.decode("utf-8").split("\n")
        except UnicodeDecodeError:
            return list(map(self._record, lines, itertools.count(first)))
        texts.pop()
        parsed: list = []
        try:  # extend() keeps what the scanner gave before it refused a line
            parsed.extend(map(_scan_json, texts, itertools.repeat(0)))
        except (ValueError, RecursionError):
            pass
        keys, message_of, records = self._keys, self._message, []
        for index, (raw, text, sequence) in enumerate(zip(lines, texts, itertools.count(first))):
            if index < len(parsed):
                obj, end = parsed[index]
                if end == len(text) and type(obj) is dict:
                    message = message_of(obj)
                    source = tuple(map(_source_value, map(obj.get, keys))) if keys else ()
                    records.append([raw, message, (text, obj, end, True), source,
                                    message is None, sequence])
                    continue
            records.append(self._record(raw, sequence))
        return records

    def _parsed_record(self, line: bytes, document, sequence: int) -> list:
        """The record of a line whose parse a stage made (None: parse it)."""
        if document is None:
            return self._record(line, sequence)
        obj = document[1]
        message = self._message(obj)
        source = tuple(map(_source_value, map(obj.get, self._keys))) if self._keys else ()
        return [line, message, document, source, message is None, sequence]

    def done(self, firsts: list = ()):
        """The end of a call to feed(): the lines it took keep no parse (those
        still held leave in a later call, parsed again by the encoder), but
        for firsts, the first records of the pending events, whose objects
        the joined events are (held bytes are capped: see caps)."""
        keep = set(map(id, firsts))
        for record in self._call_records:
            if id(record) not in keep:
                record[_DOCUMENT] = None
        self._call_records = []

    @staticmethod
    def cost(record) -> int:
        return len(record[_RAW]) + MULTILINE_LINE_OVERHEAD

    @staticmethod
    def run(out: _ItemList, chunk: bytes, records: list, first: int, last: int, *,
            start: int, end: int):
        run = records[first:last]
        out.lines(b"\n".join(map(_FIRST, run)) + b"\n", 0, [r[_DOCUMENT] for r in run])

    def lines(self, records: list, held: int, out: _ItemList, cut: bool = False):
        for record in records:
            was_held = held > 0
            held -= was_held
            if cut:
                self._cut_event([record], was_held, out)
            else:
                out.lines(record[_RAW] + b"\n", was_held, [record[_DOCUMENT]])

    def event(self, records: list, cut: bool, held: int, out: _ItemList) -> bool:
        if cut:
            return self._cut_event(records, held, out)
        if records[0][_MESSAGE] is None:  # lines that are not JSON objects
            out.event(b"\n".join(map(_FIRST, records)), cut, len(records), held)
            return True
        joined = self._joined_line(records)
        if joined is None:
            self.lines(records, held, out)
            return False
        out.event(joined[0], cut, len(records), held, joined[1])
        return True

    def _cut_event(self, records: list, held: int, out: _ItemList) -> bool:
        """records as a cut event, its message ending with the newline after
        its last line (see Joiner); False if they cannot be one (then lines:
        several; one line leaves as it came, marked cut)."""
        if records[0][_MESSAGE] is None:  # lines that are not JSON objects
            out.event(b"\n".join(map(_FIRST, records)) + b"\n", True, len(records), held)
            return True
        joined = self._joined_line(records, "\n")
        if joined is not None:
            out.event(joined[0], True, len(records), held, joined[1])
        elif len(records) == 1:
            out.event(records[0][_RAW], True, 1, held, records[0][_DOCUMENT])
        else:
            self.lines(records, held, out)
        return joined is not None or len(records) == 1

    def _record(self, line: bytes, sequence: int) -> tuple:
        """line's record (see _RAW ...)."""
        try:
            decoded = line.decode("utf-8")
            text = decoded.lstrip(_JSON_SPACE)
            obj, end = _scan_json(text, 0) if text[:1] == "{" else (None, 0)
        except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
            obj = None
        if type(obj) is not dict or text[end:].strip(_JSON_SPACE):
            return [line, None, None, _TEXT_SOURCE, False, sequence]
        return self._parsed_record(line, (text, obj, end, len(text) == len(decoded)), sequence)

    def _message(self, obj: dict) -> str | None:
        """The message of a parsed line, as the encoder reads it, or None."""
        message = obj.get(self._message_key)
        if self._journal:
            message = journal_value(message)
            if isinstance(message, list):
                message = "\n".join(m for m in message if isinstance(m, str))
        return message if isinstance(message, str) else None

    def _joined_line(self, records: list, end: str = "") -> tuple | None:
        """(line, document): the first line's object with its message replaced
        by the records' messages joined (and end after them), as one JSON
        line, and its parse (see ParsedLines); None if it cannot be written."""
        document = records[0][_DOCUMENT]
        obj = (document[1] if document is not None else
               _scan_json(records[0][_RAW].decode("utf-8").lstrip(_JSON_SPACE), 0)[0])
        obj = dict(obj)
        obj[self._message_key] = "\n".join(record[_MESSAGE] for record in records) + end
        try:
            text = _dump_json(obj)
            return text.encode("utf-8"), (text, obj, len(text), True)
        except (ValueError, UnicodeEncodeError, RecursionError):
            return None


def _source_value(value):
    """A key's value as part of a source: a string as it is, any other value
    as its type and repr, so that values Python holds equal (1, 1.0, true;
    0.0, -0.0) stay sources apart, and objects and arrays are hashable."""
    return value if type(value) is str else (type(value).__name__, repr(value))


# ------------------------------------------------------------------ queue --
# Owns the sink interface (ByteQueue: offer, put, take_past_cap, keep_held;
# SpoolQueue, after the spool, shares it), the Parcel it carries to the sender,
# and --confirm's replies on stdout.

class Parcel(NamedTuple):
    """The queue's unit, what the reader hands the sender: the encoded messages
    of one read (or of about ENCODE_LINES lines of it).

    nbytes is what the Parcel costs in memory: its messages' lengths plus
    MESSAGE_OVERHEAD each, so that many tiny messages count for what they hold.
    A replayed Parcel is one sent again after a receiver went away.  With a
    spool, start and end are where its record lies there (see Spool)."""

    messages: list
    events: list  # events carried by each message (1, or lines in a batch array)
    ends_line: list  # True where a line's reply is due (--confirm); False for a piece
    # that the next message continues, or (--multiline --spool) lines answered already
    nbytes: int
    replayed: bool = False
    start: int = 0
    end: int = 0


# Bytes a queued message costs beyond its length: the bytes object's header,
# its slots in the Parcel's three lists, and the allocator's rounding; and what
# a Parcel itself costs (the tuple and its three lists).
MESSAGE_OVERHEAD = 80
PARCEL_OVERHEAD = 512


class Answered(NamedTuple):
    """--confirm --multiline without a spool, in the queue beside Parcels:
    lines zmqpush answers "OK" itself, without waiting for ZeroMQ (see
    Ledger).  The Confirmer writes `parcel` (None, or events
    whose lines were answered or are answered now) into the transport whole,
    never refusing it, then gives `answers` replies "OK" and `refused`
    refusals (lines the Ledger did not take, see Admission)."""

    parcel: Parcel | None
    answers: int
    nbytes: int
    events: list  # the parcel's (see ByteQueue.events)
    refused: int = 0


def answered(parcel: Parcel | None, answers: int, refused: int = 0) -> Answered:
    """An Answered item of parcel (or None), answers and refusals."""
    if parcel is None:
        return Answered(None, answers, PARCEL_OVERHEAD, [], refused)
    return Answered(parcel, answers, parcel.nbytes, parcel.events, refused)


class Admission(NamedTuple):
    """--confirm --multiline without a spool: the Ledger asks, in order with
    what it queued before, whether it may take lines that the Joiner could
    hold (answered at once, never refused); the Confirmer says True once the
    transport is empty, waiting as long as it would for a line (see
    Confirmer.admits)."""

    verdict: asyncio.Future
    nbytes: int = PARCEL_OVERHEAD
    events: tuple = ()


def answered_already(parcel: Parcel) -> Parcel:
    """parcel with no line's reply due (--confirm answered its lines already)."""
    return parcel._replace(ends_line=[False] * len(parcel.messages))


def parcel_of(messages: list, events: list, ends_line: list, replayed: bool = False) -> Parcel:
    """A Parcel of these messages, with its memory cost."""
    nbytes = sum(map(len, messages)) + MESSAGE_OVERHEAD * len(messages) + PARCEL_OVERHEAD
    return _new_tuple(Parcel, (messages, events, ends_line, nbytes, replayed, 0, 0))


def replay_parcels(parcels: list, limit: int) -> list:
    """What to send again of parcels (oldest first) after a receiver went away:
    their newest distinct messages, at most limit bytes counted as in parcel_of
    plus one message, as replayed Parcels (oldest first) of at most
    REPLAY_PIECE_BYTES each, or one message.

    A message handed more than once (it was replayed before) is kept once, at
    its newest place, and pieces keep the window's slack (one Parcel) small: a
    receiver that goes away again and again then never makes the replay, or
    the window that takes it back, larger than the window's limit."""
    seen: set = set()
    picked, size = [], 0
    for parcel in reversed(parcels):
        for message, count in zip(reversed(parcel.messages), reversed(parcel.events)):
            if size >= limit:
                break
            if id(message) not in seen:
                seen.add(id(message))
                picked.append((message, count))
                size += len(message) + MESSAGE_OVERHEAD
    picked.reverse()
    replays, start, size = [], 0, 0
    for index, (message, _) in enumerate(picked):
        size += len(message) + MESSAGE_OVERHEAD
        if size >= REPLAY_PIECE_BYTES or index == len(picked) - 1:
            piece = picked[start:index + 1]
            replays.append(parcel_of([m for m, _ in piece], [c for _, c in piece],
                                     [True] * len(piece), replayed=True))
            start, size = index + 1, 0
    return replays


# A replay goes back to the queue in Parcels of about this size (see replay_parcels).
REPLAY_PIECE_BYTES = DEFAULT_READ_BYTES


class ByteQueue:
    """A queue of Parcels bounded by their total nbytes, not their count:
    a deque, and the futures of those waiting, in get() for an item (the
    sender), in put() for room; a change wakes them all, each looks again.

    The sink interface, which SpoolQueue shares (the reading pipeline never
    asks which it has): offer() takes a Parcel now if there is room, put()
    waits for room, take_past_cap() says reading stops, `durable` says
    whether a Parcel taken outlives a crash (then --confirm answers its lines
    once it is taken).  The sender takes with get() and get_nowait()
    (asyncio.QueueEmpty when there is nothing), empty() and full() as
    asyncio.Queue's.

    put() waits while the queue holds maxsize bytes or more, so it holds at
    most maxsize bytes plus one Parcel, plus what put_first() adds past the bound.
    """

    durable = False

    def __init__(self, maxsize: int):
        self._parcels: collections.deque = collections.deque()
        self.nbytes = 0
        self.bound = maxsize
        self.rewinds = 0  # see SpoolQueue
        self._getters: list = []  # futures of get() waiting for an item
        self._putters: list = []  # futures of put() waiting for room

    @staticmethod
    def _wake(waiters: list):
        """Wake every waiter of waiters (each looks at the queue again)."""
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)
        waiters.clear()

    @staticmethod
    async def _wait(waiters: list):
        """Wait until woken (see _wake)."""
        waiter = asyncio.get_running_loop().create_future()
        waiters.append(waiter)
        try:
            await waiter
        finally:
            if waiter in waiters:  # cancelled
                waiters.remove(waiter)

    def offer(self, parcel: Parcel) -> bool:
        """Take parcel now if the queue holds less than its bound; False if
        put() must wait for room.  (put_nowait's body: the plain path's step
        per read.)"""
        if self.nbytes >= self.bound:
            return False
        self._parcels.append(parcel)
        self.nbytes += parcel.nbytes
        if self._getters:
            self._wake(self._getters)
        return True

    def take_past_cap(self):
        """Reading stops: memory has no cap to pass (put() waits for the sender)."""

    def keep_held(self, groups: list):
        """The lines the stages hold (one list per stage): memory keeps
        nothing beyond the run (see SpoolQueue)."""

    def held_found(self) -> list:
        """What the stages held when a previous run ended: none in memory."""
        return []

    async def put(self, item):
        """Put item once the queue holds less than its bound."""
        while self.full():
            await self._wait(self._putters)
        self.put_nowait(item)

    def put_nowait(self, item):
        """Put item (the bound is put()'s to wait for: this never refuses)."""
        self._parcels.append(item)
        self.nbytes += item.nbytes
        if self._getters:
            self._wake(self._getters)

    async def get(self):
        """The oldest item, once there is one."""
        while self.empty():
            await self._wait(self._getters)
        return self.get_nowait()

    def get_nowait(self):
        """The oldest item; QueueEmpty if there is none."""
        if not self._parcels:
            raise asyncio.QueueEmpty
        item = self._parcels.popleft()
        self.nbytes -= item.nbytes
        if self._putters:
            self._wake(self._putters)
        return item

    def put_first(self, item):
        """Put item at the head of the queue at once, past the bound (a replay
        is already held in memory, and waiting for room could deadlock)."""
        self._parcels.appendleft(item)
        self.nbytes += item.nbytes
        self._wake(self._getters)

    def empty(self) -> bool:
        return not self._parcels

    def full(self) -> bool:
        return self.nbytes >= self.bound

    def events(self) -> int:
        """Events waiting in the queue."""
        return sum(sum(p.events) for p in self._parcels if p is not END)


class _End(NamedTuple):
    nbytes: int = 0


END = _End()


class InputError(Exception):
    """Reading stdin failed; raised by StdinReader.run() once END is queued."""


class Replies:
    """--confirm's answers to rsyslog on stdout, one line per line read: "OK",
    or a refusal that makes rsyslog send the line again.  Without a spool the
    Confirmer answers once ZeroMQ took a line, with one the reader once the
    spool holds it.

    Owns stdout: replies are written without ever blocking the loop (while
    nobody reads them, the loop waits and signals still work); the
    descriptor's O_NONBLOCK flag is restored by close().  stop_reading() is
    called when replies cannot be written (rsyslog has gone)."""

    def __init__(self, stop_reading, stdout_fd: int | None = 1):
        self._stop_reading = stop_reading
        self._fd = stdout_fd
        self._broken = False  # a reply could not be written
        self._blocking = os.get_blocking(stdout_fd) if stdout_fd is not None else None
        if stdout_fd is not None:
            os.set_blocking(stdout_fd, False)

    def close(self):
        if self._fd is not None:
            os.set_blocking(self._fd, self._blocking)
            self._fd = None

    async def reply(self, accepted: bool, lines: int = 1):
        """Answer `lines` lines alike; stop reading if that cannot be done (no
        stdout, or rsyslog has gone)."""
        text = "OK\n" if accepted else "zmqpush: not accepted by ZeroMQ in time\n"
        if self._fd is None or not await self._say(text * lines):
            self._stop_reading()

    async def _say(self, text: str) -> bool:
        """Write text; waits while stdout is full.  False if it cannot be
        written (rsyslog has gone, stdout is /dev/full): said once on stderr,
        and no reply is tried after that."""
        data = memoryview(text.encode())
        while data and not self._broken:
            try:
                data = data[os.write(self._fd, data):]
            except BlockingIOError:
                await self._writable()
            except OSError as exc:
                warn(f"cannot write --confirm replies on stdout: {exc.strerror}; "
                     "reading stops")
                self._broken = True
        return not self._broken

    async def _writable(self):
        loop = asyncio.get_running_loop()
        ready = loop.create_future()
        loop.add_writer(self._fd, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            loop.remove_writer(self._fd)


# --------------------------------------------------------------- pipeline --
# Owns what happens to the bytes StdinReader read, built once at start-up from
# the options (build_pipeline): framing (LineFramer) -> the stages the options
# ask for (Unwrapping container logs, Joining) -> one encoder -> one sink
# (ByteQueue or SpoolQueue, alike to it).  The plain path has no stage: framing
# goes straight into the bulk encoder.  A stage takes and gives items (Segment,
# ParsedLines, Joined) that say how many lines they carry and how many were
# held; --confirm around stages is the Ledger; the one quiet timer of the
# stages that hold lines is StagedPipeline's.

class Pipeline:
    """The plain path: framing, the encoder and the sink, no stage.

    feed() frames, encodes and queues what one read gave, in Parcels of about
    ENCODE_LINES lines at most, or drops them while the sink is full and
    `dropping` (policy "drop", set by the reader: input that cannot be polled
    never drops).  With --confirm and a durable sink (a spool), replies
    answer each line once the sink took it.  finish() hands over the
    unfinished last line and END."""

    def __init__(self, sink: ByteQueue, *, framer: LineFramer, encoder, counters: Counters,
                 replies: Replies | None = None):
        self.sink = sink
        self._framer = framer
        self._encoder = encoder
        self._counters = counters
        self._replies = replies if sink.durable else None  # --confirm: answered once taken
        self.dropping = False
        self.stopping = False
        self._read_at = 0.0  # when the bytes being handed were read (epoch seconds)

    async def start(self):
        """Lines a run with --multiline --spool held when it ended (see
        StagedPipeline) leave first; then, with --confirm and a durable
        sink, the first "OK" (zmqpush is ready)."""
        await self._take_held_found()
        if self._replies is not None:
            await self._replies.reply(True)

    async def _take_held_found(self):
        """The lines a previous run held (see Spool.keep_held), as lines,
        never answered again: the last stage's first, as they came to it."""
        found = [line for group in reversed(self.sink.held_found()) for line in group]
        if found:
            lines = _new_tuple(Segment, (b"".join(line + b"\n" for line in found),
                                         False, False, len(found)))
            for parcel in self.encoded([lines]):
                await self.put(answered_already(parcel))
            self.sink.keep_held([])

    def stop(self):
        """Reading stops: the sink takes what is still handed past its cap."""
        self.stopping = True
        self.sink.take_past_cap()

    def close(self):
        """Nothing left behind (StagedPipeline's timer and flushes)."""

    def held_lines(self) -> int:
        """Lines answered "OK" (--confirm) that a stage still holds: none."""
        return 0

    def admit_with(self, admits):
        """--confirm without a durable sink: admits (async () -> bool) says
        whether a stage may take lines now (see Ledger); none to ask here."""

    def report(self, action):
        """Run action, a report of the counters (SIGUSR1)."""
        action()

    async def feed(self, data: bytes, read_at: float):
        """Frame, encode and queue data, read at read_at."""
        self._read_at = read_at
        await self._hand_over(self._framer.feed(data))

    async def finish(self):
        """The unfinished last line (no newline at EOF), if any, then END."""
        await self._hand_over(self._framer.finish())
        await self.sink.put(END)

    async def _hand_over(self, segments: list):
        """Encode segments and queue them as Parcels of about ENCODE_LINES
        lines at most (or drop them when the sink is full)."""
        if len(segments) == 1 and len(segments[0].lines) <= ENCODE_LINES:
            seg = segments[0]  # the common case, at most ENCODE_LINES lines
            messages, events = self._encoder.encode(seg.lines, seg.strip_cr, seg.continues,
                                                    self._read_at)
            ends = [True] * len(messages)
            if seg.continues:
                self._counters.pieces += 1
                ends[-1] = False
            parcel, nevents = parcel_of(messages, events, ends), sum(events)
            if not self._queue_nowait(parcel, nevents):  # _put(), without a coroutine
                await self._queue_parcel(parcel, nevents)
            return
        for parcel in self.encoded(bounded_segments(segments, ENCODE_LINES)):
            await self.put(parcel)

    def encoded(self, items: list):
        """The Parcels (an iterator) of items, in order, of about ENCODE_LINES
        events each."""
        messages, events, ends = [], [], []
        encoder, read_at, lines = self._encoder, self._read_at, 0
        for item in items:
            encoded, counts, item_ends = item.encoded(encoder, read_at)
            messages += encoded
            events += counts
            ends += item_ends
            self._counters.pieces += not item_ends[-1]
            lines += sum(counts)
            if lines >= ENCODE_LINES:
                yield parcel_of(messages, events, ends)
                messages, events, ends = [], [], []
                lines = 0
        if messages:
            yield parcel_of(messages, events, ends)

    async def put(self, parcel: Parcel):
        """Queue parcel, or drop it: see _queue_nowait()."""
        nevents = sum(parcel.events)
        if not self._queue_nowait(parcel, nevents):
            await self._queue_parcel(parcel, nevents)

    def _queue_nowait(self, parcel: Parcel, nevents: int) -> bool:
        """Count parcel's events read and queue it, or drop them while the
        sink is full and dropping: True.  False when it must wait for room,
        or its lines are answered once taken (--confirm, a durable sink):
        then _queue_parcel() queues it."""
        self._counters.events_read += nevents
        if self._replies is not None:
            return False
        if self.sink.offer(parcel):
            return True
        if self.dropping:
            self._counters.events_dropped += nevents
            return True
        return False

    async def _queue_parcel(self, parcel: Parcel, nevents: int):
        """Queue parcel, counted read by _queue_nowait(), once there is room;
        with --confirm and a durable sink, answer its lines then."""
        await self.sink.put(parcel)
        if self._replies is not None:
            await self._replies.reply(True, parcel.ends_line.count(True))


def docker_entry(line: bytes) -> tuple | None:
    """(log, stream, time, attrs) of a Docker json-file line, or None if it
    is not one: a JSON object whose "log" and "stream" are strings and
    "time" an ISO 8601 time; attrs its "attrs" (--log-opt labels, env), None
    if it has none."""
    try:
        text = line.decode("utf-8").lstrip(_JSON_SPACE)
        obj, end = _scan_json(text, 0)
    except (UnicodeDecodeError, ValueError, StopIteration, RecursionError):
        return None
    if type(obj) is not dict or text[end:].strip(_JSON_SPACE):
        return None
    log, stream, when = obj.get("log"), obj.get("stream"), obj.get("time")
    if type(log) is not str or type(stream) is not str or not iso8601_time(when):
        return None
    return log, stream, when, obj.get("attrs")


def cri_entry(line: bytes) -> tuple | None:
    """(message, stream, time, partial) of a CRI log line (TIME STREAM TAG
    MESSAGE, TAG P for a partial piece, F for a full line or the last piece,
    other tags after a ":"), or None if it is not one; message as bytes."""
    parts = line.split(b" ", 3)
    if len(parts) < 3:
        return None
    tag = parts[2].split(b":", 1)[0]
    try:
        when, stream = parts[0].decode("ascii"), parts[1].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if tag not in (b"P", b"F") or not stream or not iso8601_time(when):
        return None
    return (parts[3] if len(parts) == 4 else b""), stream, when, tag == b"P"


def utf8_cut(data: bytes, most: int) -> int:
    """Where to end a piece of data of at most `most` (>= 4) bytes: not inside
    a UTF-8 character."""
    cut = most
    while cut > most - 3 and 0x80 <= data[cut] < 0xC0:
        cut -= 1
    return cut if not 0x80 <= data[cut] < 0xC0 else most


class _Partial:
    """A stream's partial entry: its pieces (str from Docker, bytes from CRI),
    their UTF-8 length, the first piece's time, the raw lines they came in
    (kept for --confirm only), the first piece's Docker "attrs" and when
    the last came (the clock's time)."""

    __slots__ = ("attrs", "count", "last", "pieces", "raw", "size", "when")

    def __init__(self, when: str, attrs):
        self.pieces: list = []
        self.size = 0
        self.count = 0
        self.when = when
        self.attrs = attrs
        self.raw: list = []
        self.last = 0.0


class Unwrapping:
    """The container stage (--docker, --cri): takes the framer's Segments of
    envelope lines, gives ParsedLines (see JsonEncoder.encode_parsed) whose
    lines are the events' objects as JSON: {"message": the app's line
    without the runtime's newline (nor one CR before it, the wire format's
    rule), "stream": ..., "attrs": Docker's "attrs" if the entry has them,
    "@timestamp": the runtime's time}.  Each envelope is parsed once; with app_json (--json on
    top) the app's line once more: an object is the event (under target,
    its message_key's string the message), "stream" and the runtime's time
    added ("@timestamp", or "@runtime_time" when the app's own "@timestamp"
    is an ISO 8601 time; an app's "stream", "attrs" kept under REPLACED_KEY, an invalid
    "@timestamp" as "_@timestamp"), any other line marked as --json marks it.

    A partial entry (Docker: a "log" without its newline; CRI: tag P) is
    held per stream until its last piece, CONTAINER_PARTIAL_QUIET seconds
    without one, or flush(); past max_line_bytes its message leaves in
    pieces marked "@continues":true.  A line that is not an entry leaves
    as its text, marked ("tags":["_jsonparsefailure"], "@json_error"), and
    is counted in json_failures; past max_line_bytes in pieces as well.
    Pieces of an envelope line over the framer's limit (cut at
    max_line_bytes, see LineFramer's piece_bytes) pass as they are (the
    encoder marks them)."""

    def __init__(self, runtime: str, max_line_bytes: int, counters: Counters, *,
                 app_json: bool = False, target: str | None = None,
                 message_key: str | None = None, keep_raw: bool = False,
                 clock=time.monotonic):
        self._entry = docker_entry if runtime == "docker" else cri_entry
        self._docker = runtime == "docker"
        self._widest = 4 if self._docker else 1  # UTF-8 bytes a str or bytes item may take
        self._what = ("not a Docker json-file entry" if self._docker
                      else "not a CRI log line")
        self._max = max_line_bytes
        self._counters = counters
        self._app_json = app_json
        self._target = target
        self._message_key = message_key
        self._keep_raw = keep_raw
        self._clock = clock
        self._partials: dict = {}  # stream: _Partial, in the order they began
        self._held = 0  # raw lines in the partial entries
        self._tail_due = False  # the next line is the last piece of a framed line
        self._run_held = 0  # events of the run being built that end no line read now

    def feed(self, items: list) -> list:
        out, lines, documents = [], [], []
        for item in items:
            seg = item
            if seg.continues or self._tail_due:
                self._close_run(out, lines, documents)
                lines, documents = [], []
                self._tail_due = seg.continues
                if seg.continues:
                    out.append(seg)
                    continue
                last_piece, seg = seg.split(1)
                out.append(last_piece._replace(strip_cr=False))
                if seg is None:
                    continue
            chunk = seg.lines
            if seg.strip_cr and 0x0D in chunk:
                chunk = chunk.replace(b"\r\n", b"\n")
            raws = chunk.split(b"\n")
            raws.pop()
            for raw in raws:
                self._take(raw, lines, documents)
        self._close_run(out, lines, documents)
        return out

    def flush(self) -> list:
        """Every partial entry, now, as it is."""
        return self._release(lambda partial: True)

    def flush_due(self, now: float) -> list:
        """The partial entries whose last piece came CONTAINER_PARTIAL_QUIET
        before now (the loop's time) or earlier."""
        return self._release(lambda partial: partial.last + CONTAINER_PARTIAL_QUIET
                             <= now + MIN_WINDOW)

    def deadline(self) -> float | None:
        """When the first partial entry is due, or None: none held."""
        if not self._partials:
            return None
        return min(p.last for p in self._partials.values()) + CONTAINER_PARTIAL_QUIET

    def held(self) -> int:
        """Raw lines held in partial entries."""
        return self._held

    def holding(self) -> list:
        """The raw lines held (with keep_raw), oldest first by entry."""
        return [raw for partial in self._partials.values() for raw in partial.raw]

    def _release(self, due) -> list:
        lines, documents = [], []
        for stream, partial in list(self._partials.items()):
            if due(partial):
                self._end(stream, lines, documents)
                self._run_held += 1
        out: list = []
        self._close_run(out, lines, documents)
        return out

    def _close_run(self, out: list, lines: list, documents: list):
        """The run's events as one ParsedLines; its held lines (see Segment)
        are the events that end no line just read: pieces cut off a message,
        and what earlier lines left held (--confirm answered those, or
        answers them with the line that ends them: one reply per line).
        Counted per call: exact when lines come one at a time (Ledger)."""
        if lines:
            out.append(ParsedLines(b"".join(lines), documents, self._run_held))
        self._run_held = 0

    def _take(self, raw: bytes, lines: list, documents: list):
        """One envelope line: its event added to lines and documents, or held."""
        entry = self._entry(raw)
        if entry is None:
            self._counters.json_failures += 1
            self._not_entry(raw.decode("utf-8", "replace"), lines, documents)
            return
        if self._docker:
            message, stream, when, attrs = entry
            partial = not message.endswith("\n")
            if not partial:
                message = message[:-1]
                if message.endswith("\r") and stream not in self._partials:
                    message = message[:-1]  # a held entry's CR goes in _end
        else:
            message, stream, when, partial = entry
            attrs = None
        held = self._partials.get(stream)
        if held is None and not partial and len(message) * self._widest <= self._max:
            self._add(self._event(message, stream, when, attrs), lines, documents)
            return  # the common case: a whole entry that fits
        if held is None:
            held = self._partials[stream] = _Partial(when, attrs)
            while len(self._partials) > CONTAINER_STREAMS:
                self._end(next(iter(self._partials)), lines, documents)
                self._run_held += 1
        held.pieces.append(message)
        held.size += len(message) if isinstance(message, bytes) else len(
            message.encode("utf-8", "surrogatepass"))
        held.last = self._clock()
        held.count += 1
        self._held += 1
        if self._keep_raw:
            held.raw.append(raw)
        if held.size > self._max:
            self._cut(stream, held, lines, documents)
        if not partial:
            self._end(stream, lines, documents, whole=True)

    def _not_entry(self, text: str, lines: list, documents: list):
        """A line that is not an entry, as its text, marked; past
        max_line_bytes in pieces, all but the last marked "@continues"
        (held lines, see _close_run)."""
        if len(text) * 3 > self._max:  # else it fits: the common case
            data = text.encode("utf-8")
            while len(data) > self._max:
                cut = utf8_cut(data, self._max)
                self._add({"message": data[:cut].decode("utf-8"), "@continues": True,
                           "tags": [JSON_FAILURE_TAG], JSON_ERROR_KEY: self._what},
                          lines, documents)
                self._run_held += 1
                data = data[cut:]
            text = data.decode("utf-8")
        self._add({"message": text, "tags": [JSON_FAILURE_TAG], JSON_ERROR_KEY: self._what},
                  lines, documents)

    def _cut(self, stream: str, held: _Partial, lines: list, documents: list):
        """held's message while over max_line_bytes: pieces marked continues."""
        data = b"".join(held.pieces) if isinstance(held.pieces[0], bytes) else "".join(
            held.pieces).encode("utf-8", "surrogatepass")
        while len(data) > self._max:
            cut = utf8_cut(data, self._max)
            self._add(self._event(self._text(data[:cut]), stream, held.when, held.attrs,
                                  cut=True), lines, documents)
            self._run_held += 1
            data = data[cut:]
        held.pieces = [data if isinstance(held.pieces[0], bytes)
                       else data.decode("utf-8", "surrogatepass")]
        held.size = len(data)

    def _end(self, stream: str, lines: list, documents: list, whole: bool = False):
        """A stream's partial entry leaves as one event (or as its last piece);
        whole: its last piece came (a Docker CR it ends with then goes)."""
        held = self._partials.pop(stream)
        self._held -= held.count
        message = held.pieces[0][:0].join(held.pieces)
        if whole and self._docker and message.endswith("\r"):
            message = message[:-1]
        self._add(self._event(message, stream, held.when, held.attrs), lines, documents)

    @staticmethod
    def _text(message) -> str:
        """A message as text: invalid UTF-8 (CRI) as U+FFFD."""
        return message.decode("utf-8", "replace") if isinstance(message, bytes) else message

    def _event(self, message, stream: str, when: str, attrs=None, cut: bool = False) -> dict:
        """The event of an entry's message (see the class)."""
        message = self._text(message)
        ours = {"stream": stream} if attrs is None else {"stream": stream, "attrs": attrs}
        if self._app_json and not cut:
            obj, why = self._app_object(message)
            if obj is not None:
                return self._app_event(obj, ours, when)
            self._counters.json_failures += 1
            return {"message": message, **ours, "@timestamp": when,
                    "tags": [JSON_FAILURE_TAG], JSON_ERROR_KEY: why}
        event = {"message": message, **ours, "@timestamp": when}
        if cut:
            event["@continues"] = True
        return event

    @staticmethod
    def _app_object(message: str) -> tuple:
        """(object, None) if message is a JSON object zmqpush can send, else
        (None, why) in the words of --json's "@json_error"."""
        text = message.lstrip(_JSON_SPACE)
        try:
            obj, end = _scan_json(text, 0)
        except (ValueError, StopIteration, RecursionError) as exc:
            return None, _json_failure(exc)
        if text[end:].strip(_JSON_SPACE):
            return None, "not JSON"
        if type(obj) is not dict:
            return None, "not a JSON object"
        if text.count("{") + text.count("[") > MAX_JSON_DEPTH and json_depth(obj) > MAX_JSON_DEPTH:
            return None, f"nested deeper than {MAX_JSON_DEPTH}"
        if may_hold_bracket_key(text) and bracket_key(obj):
            return None, BRACKET_KEY_REFUSAL
        return obj, None

    def _app_event(self, obj: dict, ours: dict, when: str) -> dict:
        """The app's object as the event, with the runtime's fields (ours:
        "stream", Docker's "attrs") and time."""
        key = self._message_key
        message = obj.pop(key) if key and isinstance(obj.get(key), str) else None
        event = {self._target: obj} if self._target is not None else obj
        if message is not None:
            event["message"] = message
        fixes = fix_reserved(event)  # an invalid "@timestamp" goes to "_@timestamp"
        ours = {**ours, "@runtime_time" if "@timestamp" in event else "@timestamp": when}
        if fixes:
            ours[JSON_ERROR_KEY] = "; ".join(fixes)
            self._counters.json_fixed += 1
        return merged_event(event, ours, False)  # the app's values ours replace: REPLACED_KEY

    def _add(self, event: dict, lines: list, documents: list):
        """event as a JSON line and its parse; a value JSON cannot carry (a
        lone surrogate, a number out of range) leaves it as its message."""
        try:
            text = _dump_json(event)
            line = text.encode("utf-8")
        except (ValueError, UnicodeEncodeError, RecursionError) as exc:
            message = event.get("message")
            safe = {"message": message.encode("utf-8", "surrogatepass").decode(
                        "utf-8", "replace") if isinstance(message, str) else "",
                    "tags": [JSON_FAILURE_TAG], JSON_ERROR_KEY: (
                        "lone surrogate" if isinstance(exc, UnicodeEncodeError)
                        else NUMBER_OUT_OF_RANGE)}
            for key in ("stream", "@timestamp"):
                if key in event:
                    safe[key] = event[key]
            self._counters.json_failures += 1
            text = _dump_json(safe)
            line = text.encode("utf-8")
        lines.append(line + b"\n")
        documents.append((text, event, len(text), True))


def all_held(items: list) -> list:
    """items, every line of each counted as held before (see Segment.held)."""
    for item in items:
        if type(item) is Joined:
            item.held = item.nlines()
    return [item if type(item) is Joined else item._replace(held=item.nlines())
            for item in items]


class Joining:
    """The joining stage (--multiline, --multiline-pattern): a Joiner (with
    --json or --journal, its ObjectView).  Takes the framer's Segments, gives
    items: Segments (ParsedLines) and Joined events.  A piece of an
    over-long line ends the pending event and passes as it is, its last
    piece too (a line of its own: the pieces give the line back, see
    README "Wire format and line handling"); a run's CR before newline is
    stripped here where the framer says so.  What the held lines of a
    ParsedLines (pieces Unwrapping cut) give is counted held too."""

    def __init__(self, joiner, timeout: float):
        self._joiner = joiner
        self._timeout = timeout
        self._tail_due = False  # the next line is the last piece of an over-long line

    def feed(self, items: list) -> list:
        out: list = []
        joiner = self._joiner
        for item in items:
            seg = item
            if seg.continues:  # a piece of an over-long line: the event before it ends
                out += joiner.flush()
                out.append(seg)
                self._tail_due = True
                continue
            if self._tail_due:
                self._tail_due = False
                last_piece, seg = seg.split(1)
                out.append(last_piece)
                if seg is None:
                    continue
            if type(seg) is ParsedLines:  # parsed by a stage before (Unwrapping)
                out += self._parsed(seg)
                continue
            chunk = seg.lines
            if seg.strip_cr and 0x0D in chunk:
                chunk = chunk.replace(b"\r\n", b"\n")
            out += joiner.feed(chunk)
        return out

    def _parsed(self, item: ParsedLines) -> list:
        """item through the Joiner: what its held lines give counted held
        too (answered, see Ledger), then its other lines."""
        if not item.held:
            return self._joiner.feed(item.lines, item.documents)
        held, rest = item.split(item.held)
        out = all_held(self._joiner.feed(held.lines, held.documents))
        return out + self._joiner.feed(rest.lines, rest.documents) if rest else out

    def flush(self) -> list:
        """Every line held, now."""
        return self._joiner.flush()

    def flush_due(self, now: float) -> list:
        """What the quiet timer releases at now (the loop's time)."""
        return self._joiner.flush_quiet(now + MIN_WINDOW, self._timeout)

    def deadline(self) -> float | None:
        """When its quiet timer is due (the loop's time), or None: nothing held."""
        return self._joiner.quiet_at(self._timeout)

    def held(self) -> int:
        """Lines held."""
        return self._joiner.pending()

    def holding(self) -> list:
        """The lines held (bytes, without newline), oldest first."""
        return self._joiner.holding()


def lines_read(segments: list) -> int:
    """The lines segments carry, each over-long line once (its last piece)."""
    return sum(seg.nlines() for seg in segments if not seg.continues)


def runs_within(seg: Segment, most: int) -> list:
    """seg cut at line ends into Segments of about `most` bytes at most (a
    longer line alone); a piece of a line as it is."""
    lines = seg.lines
    if len(lines) <= most or seg.continues:
        return [seg]
    out, start = [], 0
    while start < len(lines):
        end = lines.find(b"\n", start + most) + 1 or len(lines)
        out.append(seg._replace(lines=lines[start:end]))
        start = end
    return out


_RELEASE_ALL = operator.methodcaller("flush")  # what StagedPipeline.flushed() lets go at the end


class StagedPipeline(Pipeline):
    """A Pipeline with stages between framing and the encoder (see Joining).

    What a stage holds leaves when the stage says so, at finish() and stop(),
    before a SIGUSR1 report (see report()), and when its quiet timer is due:
    the one timer, running only while a stage holds lines.  One hand-over or
    flush at a time, in order.  With --confirm, the Ledger queues and answers."""

    def __init__(self, sink: ByteQueue, stages: list, *, ledger: Ledger | None = None,
                 run_bytes: int = 0, **kwargs):
        super().__init__(sink, **kwargs)
        self._stages = stages
        self._run_bytes = run_bytes  # what a stage takes at once at most, if not 0
        self._ledger = ledger
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._lock = asyncio.Lock()
        self._flushes: set = set()  # tasks of timer and report flushes

    def held_lines(self) -> int:
        """Lines answered "OK" (--confirm) that the stages still hold and no
        durable sink keeps (see Ledger)."""
        return self.held() if self._ledger is not None else 0

    async def _take_held_found(self):
        """The lines a previous run held (a durable sink keeps them, see
        Spool.keep_held) go through the stages again, each from the stage
        that held it, the last stage's first (what it held came through the
        stages before it earlier), with --confirm answered already: what they
        began goes on with the lines that follow.  Those of a run with other
        stages go through them all."""
        found = self.sink.held_found()
        if not found:
            return
        if len(found) != len(self._stages):
            found = [[line for group in reversed(found) for line in group]]
        async with self._lock:
            for first in reversed(range(len(found))):
                for line in found[first]:
                    item = _new_tuple(Segment, (line + b"\n", False, False, 0))
                    await self._queue_held(self.through([item], first))
            self.sink.keep_held(self.holding())
        self._arm()

    def held(self) -> int:
        """Lines the stages hold."""
        return sum(stage.held() for stage in self._stages)

    def holding(self) -> list:
        """The lines each stage holds (bytes, without newline), oldest first:
        one list per stage."""
        return [stage.holding() for stage in self._stages]

    def admit_with(self, admits):
        if self._ledger is not None:
            self._ledger.admits = admits

    async def _hand_over(self, segments: list):
        async with self._lock:
            await self._take_read(segments)
        self._arm()

    async def _take_read(self, segments: list):
        """What one read gave (or the framer's last line), through the
        stages, queued.  Without --confirm, or with it and a durable sink: in
        runs (see _deliver_read), then the sink keeps what the stages hold
        (one write of `held` a read at most), then, with --confirm, every
        line read is answered "OK" (each is spooled or kept in `held` by
        then).  With --confirm and no durable sink the Ledger takes it."""
        if self._ledger is not None:
            await self._ledger.take(segments, self)
            return
        held_before = self.held()
        await self._deliver_read(segments)
        if self.sink.durable and (held_before or self.held()):
            self.sink.keep_held(self.holding())
        answers = lines_read(segments) if self._replies is not None else 0
        if answers:
            await self._replies.reply(True, answers)

    async def _deliver_read(self, segments: list):
        """What one read gave, through the stages, encoded and queued (with
        --confirm answered with the read: no reply as each is queued)."""
        if not self._run_bytes:
            await self._queue_held(self.through(bounded_segments(segments, ENCODE_LINES)))
            return
        for seg in bounded_segments(segments, ENCODE_LINES):  # what a stage parses of
            for run in runs_within(seg, self._run_bytes):  # one run is alive at once
                await self._queue_held(self.through([run]))

    async def finish(self):
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        async with self._lock:
            await self._take_read(self._framer.finish())
            await self.deliver_held(self.flushed(_RELEASE_ALL))
        await self.sink.put(END)

    def through(self, items: list, first: int = 0) -> list:
        """items passed through every stage from the first-th on."""
        for stage in self._stages[first:]:
            items = stage.feed(items)
        return items

    def flushed(self, release) -> list:
        """What release(stage) (Joining.flush or a flush_due) lets go of, each
        stage's passed through the stages after it."""
        items: list = []
        for stage in self._stages:
            items = stage.feed(items) + release(stage)
        return items

    async def deliver(self, items: list):
        """Encode and queue items, none of whose lines was answered yet."""
        for parcel in self.encoded(items):
            await self.put(parcel)

    async def deliver_held(self, items: list):
        """Encode and queue items of lines held (with --confirm answered
        already); then a durable sink keeps what the stages still hold."""
        await self._queue_held(items)
        if items and self.sink.durable:
            self.sink.keep_held(self.holding())

    async def _queue_held(self, items: list):
        """Encode and queue items of lines held or read now: with --confirm
        answered already, or with the read (see _take_read), so that none
        is answered as it is queued."""
        if self._ledger is not None:
            await self._ledger.queue_answered(items, self)
            return
        for parcel in self.encoded(items):
            await self.put(parcel if self._replies is None else answered_already(parcel))

    def _arm(self):
        """Start the quiet timer for the first stage due, if one holds lines
        and no timer runs."""
        if self._timer is None:
            due = [at for at in (stage.deadline() for stage in self._stages) if at is not None]
            if due:
                self._timer = self._loop.call_at(min(due), self._on_quiet)

    def _on_quiet(self):
        self._timer = None
        if self.held() and not self.stopping:
            self._after_flush(self._flush_quiet())

    async def _flush_quiet(self):
        async with self._lock:
            now = self._loop.time()
            await self.deliver_held(self.flushed(lambda stage: stage.flush_due(now)))
        self._arm()

    def report(self, action):
        """Run action (a report of the counters) once what stages hold is queued."""
        if not self.held():
            action()
            return

        async def flush_then_report():
            async with self._lock:
                await self.deliver_held(self.flushed(_RELEASE_ALL))
            action()
        self._after_flush(flush_then_report())

    def _after_flush(self, coroutine):
        """Run coroutine as a task; its failure ends the run (the loop's
        exception handler: see Shipper)."""
        task = self._loop.create_task(coroutine)
        self._flushes.add(task)
        task.add_done_callback(self._flushed)

    def _flushed(self, task: asyncio.Task):
        self._flushes.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._loop.call_exception_handler({"message": "flushing a multi-line event",
                                               "exception": task.exception()})

    def close(self):
        """No timer or flush is left behind."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for task in self._flushes:
            task.cancel()


class Ledger:
    """--confirm without a durable sink around stages that hold lines
    (--multiline): rsyslog sends a line only once the one before it is
    answered, so no reply may wait for a stage to let a line go; every line
    read still gets one reply, in order with all the others, all written by
    the Confirmer.  (With a durable sink the pipeline answers a read once
    the spool and the file `held` keep it: see StagedPipeline._take_read.)

    Lines go through the stages one at a time, so that which item holds the
    line just read is told by the items' held counts.  A line that leaves
    as a line of its own as it is read is answered as without stages: once
    ZeroMQ took it (the Confirmer, which may refuse it).  A line a stage
    holds is answered "OK" at once (an Answered item), and so is one that
    leaves in an event with lines held before.  What leaves later of lines
    answered already brings no reply: it is queued as Answered items, which
    the Confirmer writes into the transport whole and never refuses.  Held
    lines are lost only if zmqpush is killed (SIGKILL, a crash) while they
    are held.

    Lines are taken only while the transport holds
    nothing (`admits`, the Confirmer's, set by the Shipper): otherwise they
    wait as a line waits for ZeroMQ, and are refused if it stays full
    (rsyslog sends them again), so that what is answered and not handed stays
    about one event, and a receiver's outage is rsyslog's to buffer.

    The stages pass the pieces of an over-long line (see LineFramer) as they
    are: the line is answered as a line of its own, after its last piece."""

    def __init__(self, counters: Counters):
        self._counters = counters
        self._piece_left = False  # the next line is the last piece of an over-long line
        self.admits = None  # async () -> bool, whether to take lines (the Confirmer's)

    async def take(self, segments: list, pipeline: StagedPipeline):
        """Pass segments through pipeline's stages line by line (a piece of
        an over-long line as it is), queue and answer them (see the class)."""
        for seg in segments:
            if seg.continues:
                await self._take_line(seg, pipeline)
                continue
            lines, start = seg.lines, 0
            while start < len(lines):
                end = lines.index(b"\n", start) + 1
                await self._take_line(_new_tuple(Segment, (lines[start:end], seg.strip_cr,
                                                           False, 0)), pipeline)
                start = end

    async def _take_line(self, line: Segment, pipeline: StagedPipeline):
        """One line (or piece of one) through the stages, queued and answered.
        A piece and its line's last piece are never refused alone (the
        stages pass them as they are, see Joining: the line's reply is the
        last piece's)."""
        piece = self._piece_left or line.continues
        self._piece_left = line.continues
        if not piece and self.admits is not None and not await self.admits():
            await pipeline.put(answered(None, 0, 1))
            return
        out = pipeline.through([line])
        fresh = [index for index, item in enumerate(out) if item.nlines() > item.held]
        before, line_item = out[fresh[0]].split(out[fresh[0]].held) if fresh else (None, None)
        if line_item is None:  # held, or ending an event of lines answered before
            await self.queue_answered(out, pipeline)
            await pipeline.put(answered(None, 1))
            return
        index = fresh[0]
        await self.queue_answered(out[:index] + ([before] if before else []), pipeline)
        await pipeline.deliver([line_item])
        await self.queue_answered(out[index + 1:], pipeline)

    async def queue_answered(self, items: list, pipeline: StagedPipeline):
        """Queue items (lines answered already) as Answered items, which the
        Confirmer writes into the transport whole and never refuses."""
        for parcel in pipeline.encoded(items):
            self._counters.events_answered += sum(parcel.events)
            await pipeline.put(answered(parcel, 0))


def build_pipeline(config: Config, sink: ByteQueue, *, encoder, counters: Counters,
                   replies: Replies | None) -> Pipeline:
    """The reading pipeline the options ask for: the plain one, or with the
    container stage and the joining stage (and --confirm's Ledger around
    them).  Within the running loop."""
    framed = (config.max_line_bytes if config.container is None
              else max(config.max_line_bytes, CONTAINER_LINE_BYTES))
    parts = dict(framer=LineFramer(framed, config.max_line_bytes), encoder=encoder,
                 counters=counters, replies=replies)
    multiline = config.multiline
    if multiline is None and config.container is None:
        return Pipeline(sink, **parts)
    clock = asyncio.get_running_loop().time
    stages: list = []
    if config.container is not None:
        stages.append(Unwrapping(
            config.container, config.max_line_bytes, counters,
            app_json=config.structured == "json", target=config.json_target,
            message_key=config.json_message_key, keep_raw=sink.durable, clock=clock))
    if multiline is not None:
        stages.append(Joining(joiner_for(config, multiline, counters, clock), multiline.timeout))
    ledger = Ledger(counters) if replies is not None and not sink.durable else None
    sources = multiline is not None and multiline.sources is not None
    return StagedPipeline(sink, stages, ledger=ledger,
                          run_bytes=JSON_RUN_BYTES if sources or config.container else 0,
                          **parts)


def joiner_for(config: Config, multiline: Multiline, counters: Counters, clock):
    """The Joiner, its view of a line the line itself, or the parsed object's
    message and source when lines are parsed (--json, --journal, --docker, --cri)."""
    rule = joining_rule(multiline)
    view = TextView if multiline.sources is None else ObjectView(
        multiline.sources, None if config.container else config.json_message_key,
        config.structured == "journal")
    return Joiner(rule, multiline.max_lines, multiline.max_bytes, counters, clock=clock,
                  view=view)


# ------------------------------------------------------------------ input --
# Owns stdin: non-blocking reads woken by an edge-triggered epoll, the
# coalescing window, packet sockets, FIONREAD; what is read goes to a Pipeline;
# glibc's heap trimmed every few MiB read (HeapTrimmer).

# Under glibc's smallest threshold for serving an allocation with mmap (128 KiB).
SLOW_READ_BYTES = 32 << 10
# The largest packet of a packet-mode pipe (O_DIRECT): Linux splits a write into
# packets of a page each (PIPE_BUF, 4096, where pages are 4 KiB).
PIPE_PACKET_BYTES = max(select.PIPE_BUF, os.sysconf("SC_PAGE_SIZE"))
# Socket types whose every read returns one packet and discards what did not fit.
_PACKET_SOCKETS = (socket.SOCK_SEQPACKET, socket.SOCK_DGRAM)
# epoll events after which the reader no longer trusts FIONREAD (see _drained).
_HANGUP_EVENTS = select.EPOLLHUP | select.EPOLLRDHUP | select.EPOLLERR
_READ_EDGES = select.EPOLLIN | select.EPOLLRDHUP | select.EPOLLET
_HANGUP_EDGES = select.EPOLLRDHUP | select.EPOLLET  # EPOLLHUP and EPOLLERR are implied
F_GETPIPE_SZ = getattr(fcntl, "F_GETPIPE_SZ", 1032)
MIN_WINDOW = 0.001  # a shorter window saves no wake-up: the loop's timers count in ms
# glibc's heap is handed back (malloc_trim) each time this much more was read,
# when its free chunks add up to TRIM_FREE_BYTES or more.
TRIM_EVERY_BYTES = 4 << 20
TRIM_FREE_BYTES = 4 << 20


class HeapTrimmer:
    """Gives glibc's free heap pages back to the system each time stdin gave
    TRIM_EVERY_BYTES more: no timer, a step per read.

    At full speed a read's transient copies (the bytes read, escaped, joined:
    64 to 350 KiB each) come from glibc's heap, between ZeroMQ's small
    message buffers that outlive them; the holes they leave grow the heap by
    up to 20 MiB of free, touched pages (measured on JSON lines: 22 MiB of heap
    holding 6).  malloc_trim(0) releases every whole free page, inside the heap
    too, so a hole costs memory again only once reused (JSON lines' peak 50
    to 56 MiB instead of 58 to 71: bench/README.md "Many receivers").  A
    heap holding less than TRIM_FREE_BYTES free is left as it is: there a
    trim only hands back the pages the next reads fault in again (1 to 3 MiB
    at full speed to a fast receiver: 13,000 to 16,000 page faults and their
    kernel time per million lines, for no lower peak).
    ctypes is imported at the first trim, so short runs do not pay its
    import; where malloc_trim is missing (not glibc) nothing is done."""

    def __init__(self, every: int = TRIM_EVERY_BYTES):
        self._every = every
        self._left = every
        self._trim = None  # libc's malloc_trim, once looked up
        self._free_bytes = None  # what glibc's heap holds free, once looked up

    def read(self, nbytes: int):
        """nbytes more were read: trim when TRIM_EVERY_BYTES have been since the last."""
        self._left -= nbytes
        if self._left <= 0:
            self._left = self._every
            self._trim_heap()

    def _trim_heap(self):
        if self._trim is None:
            try:
                self._trim, self._free_bytes = glibc_heap_calls()
            except (ImportError, OSError, AttributeError):  # not glibc
                self._left = self._every = sys.maxsize
                return
        if self._free_bytes() >= TRIM_FREE_BYTES:
            self._trim(0)


def glibc_heap_calls() -> tuple:
    """glibc's malloc_trim, and a function that returns the bytes its heap
    holds in free chunks (mallinfo2's fordblks; mallinfo's before glibc 2.33).
    Raises ImportError, OSError or AttributeError where glibc is not."""
    import ctypes
    libc = ctypes.CDLL(None)
    mallinfo = getattr(libc, "mallinfo2", None)
    field = ctypes.c_size_t if mallinfo is not None else ctypes.c_int
    if mallinfo is None:
        mallinfo = libc.mallinfo

    class MallInfo(ctypes.Structure):
        _fields_ = [(name, field) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                               "usmblks", "fsmblks", "uordblks", "fordblks",
                                               "keepcost")]

    mallinfo.restype = MallInfo
    return libc.malloc_trim, lambda: mallinfo().fordblks


class StdinReader:
    """Reads fd until EOF, stop() or a read error, handing what it reads to a
    Pipeline (which frames, encodes and queues it).

    Owns the descriptor's O_NONBLOCK flag (restored by close()) and the epoll
    object.  While the pipeline's sink is full it stops reading (policy
    "block": the pipe fills and the producer blocks) or the pipeline drops
    and counts (policy "drop").
    Regular files, /dev/null, /dev/zero and the like cannot be polled: they are
    read directly, always with policy "block" (nothing upstream waits on them,
    so dropping would only lose lines).

    No byte of a packet source is lost (a read returns one packet there, and
    the kernel discards what does not fit): every read of a pipe asks for at
    least PIPE_PACKET_BYTES (a packet-mode pipe's largest packet), and on a
    SEQPACKET or datagram socket each read is sized by peeking at the length
    of the packet waiting (see _read_packet).  Which kind stdin is, is told
    once, at start.

    It reads until EAGAIN (a short read does not prove a pipe or socket empty:
    packet-mode pipes, SEQPACKET and ancillary data stop reads short), or, on
    a pipe, until FIONREAD says it holds nothing (see _drained), and gives the
    loop a turn between any two reads, so signals, timers and the sender run
    even when reads never block: after a short read that followed a wait, the
    wait that EAGAIN (or the empty pipe) brings is that turn.  `ended` is set at EOF
    or stop(), even while the last puts still wait for room.

    Coalescing (window > 0): an edge that comes less than a window after the last
    read is read when the window ends, with all that came meanwhile; stdin's epoll
    watches only for a hang-up until then, so the lines between cost no wake-up.
    An edge after a quiet spell is read at once.  The window shrinks while input
    comes faster than half of stdin's buffer a window, so that the producer never
    blocks on a full buffer within one (the rate is measured once per window or
    more); below a millisecond, or while stdin holds a quarter of its buffer
    already (zmqpush is what is slow), every edge is read at once.  stop()
    and a hang-up end a window early; what came within it is read first.
    """

    def __init__(self, fd: int, pipeline: Pipeline, *, counters: Counters, read_bytes: int,
                 drop_when_full: bool, coalesce: float = 0.0):
        self._fd = fd
        self._pipeline = pipeline
        self._counters = counters
        self._stopping = False
        self.ended = asyncio.Event()
        self._read_at = time.time()
        self._waiter: asyncio.Future | None = None
        self._loop = asyncio.get_running_loop()
        self._flags = None
        self._hung_up = False  # epoll said HUP, RDHUP or ERR: read on to EAGAIN or EOF
        self._queued_bytes = bytearray(4)  # FIONREAD's answer (see _drained)
        mode = os.fstat(fd).st_mode
        self._packet_socket = self._packet_socket_of(fd) if stat.S_ISSOCK(mode) else None
        if self._packet_socket is not None:
            self._read_ready = self._read_packet
            self._peeked = bytearray(1)
        least = PIPE_PACKET_BYTES if stat.S_ISFIFO(mode) else 1
        self._read_bytes = max(read_bytes, least)
        self._slow_bytes = max(min(read_bytes, SLOW_READ_BYTES), least)  # see _read_ready
        self._asking = self._read_bytes  # what the next read asks for
        self._epoll = self._watch()
        self._fifo = self._epoll is not None and stat.S_ISFIFO(mode)
        pipeline.dropping = drop_when_full and self._epoll is not None
        self._window = coalesce if self._epoll is not None else 0.0
        self._capacity = self._buffer_bytes()
        self._pace = self._window  # the window at the rate measured last (see _within_window)
        self._rate_since, self._rate_bytes = self._read_at, 0  # bytes read since then
        self._window_timer: asyncio.TimerHandle | None = None
        self._flushing = False  # stopped within a window: read what came in it, then end
        self._heap = HeapTrimmer()

    def _buffer_bytes(self) -> int:
        """What stdin's kernel buffer holds: a pipe's size, else 64 KiB."""
        if self._fifo:
            try:
                return fcntl.fcntl(self._fd, F_GETPIPE_SZ)
            except OSError:
                pass
        return 64 << 10

    @staticmethod
    def _packet_socket_of(fd: int) -> socket.socket | None:
        """A socket on a duplicate of fd if fd is a SEQPACKET or datagram socket
        (its own descriptor: closing it leaves fd open), else None."""
        duplicate = os.dup(fd)
        try:
            sock = socket.socket(fileno=duplicate)
        except OSError:  # a family Python cannot wrap: not a packet socket it reads
            os.close(duplicate)
            return None
        if sock.getsockopt(socket.SOL_SOCKET, socket.SO_TYPE) in _PACKET_SOCKETS:
            return sock
        sock.close()
        return None

    def _watch(self):
        """Non-blocking fd in an edge-triggered epoll watched by the loop, or None."""
        epoll = select.epoll()
        try:
            epoll.register(self._fd, _READ_EDGES)
        except PermissionError:
            epoll.close()
            return None
        self._flags = os.get_blocking(self._fd)
        os.set_blocking(self._fd, False)
        self._loop.add_reader(epoll.fileno(), self._on_epoll)
        return epoll

    def _on_epoll(self):
        self._note_hangups()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _wake(self):
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def stop(self):
        """Stop reading soon; what was read (an unfinished line too) is still
        sent, and with a spool kept there even past its cap."""
        self._stopping = True
        self._flushing = self._window_timer is not None
        self.ended.set()
        self._wake()
        self._pipeline.stop()

    def stop_when_read(self):
        """Read what stdin holds now (FIONREAD's count), never waiting for more,
        then end as at EOF: for a stop signal that came while zmqpush started,
        so that the lines written before it are shipped.  Input that cannot be
        polled (a regular file, which would be read whole) stops at once."""
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, self._queued_bytes)
            self._budget = int.from_bytes(self._queued_bytes, sys.byteorder)
        except OSError:
            self._budget = 0
        if self._epoll is None or self._budget <= 0:
            self.stop()
            return
        self._read_any = self._read_ready
        self._read_ready = self._read_within_budget
        self._read_after_wait = self._end_instead_of_waiting

    def _read_within_budget(self) -> bytes | None:
        """_read_ready while stop_when_read() drains: None once the budget is read."""
        if self._budget <= 0:
            return None
        data = self._read_any()
        if data:
            self._budget -= len(data)
        return data

    @staticmethod
    async def _end_instead_of_waiting() -> bytes:
        return b""

    def close(self):
        """Unwatch and restore the descriptor's blocking flag; the pipeline
        leaves nothing behind."""
        self._pipeline.close()
        if self._epoll is not None:
            self._loop.remove_reader(self._epoll.fileno())
            self._epoll.close()
            self._epoll = None
        if self._flags is not None:
            os.set_blocking(self._fd, self._flags)
            self._flags = None
        if self._packet_socket is not None:
            self._packet_socket.close()
            self._packet_socket = None

    async def run(self):
        """Read until EOF, stop() or a read error; then hand over the unfinished
        line and END.  A read error is raised after that, as InputError: what
        was read before it is still delivered."""
        failure, turned = None, True
        feed = self._pipeline.feed
        await self._pipeline.start()
        while not self._stopping or self._flushing:
            if not turned:
                await asyncio.sleep(0)
            try:
                data = None if turned and self._drained() else self._read_ready()
                waited = data is None
                if waited:
                    if self._stopping:
                        break
                    data = await self._read_after_wait()
            except OSError as exc:
                failure = exc
                break
            if not data:
                break
            self._read_at = time.time()
            self._rate_bytes += len(data)
            self._counters.bytes_read += len(data)
            await feed(data, self._read_at)
            self._heap.read(len(data))
            # A short read that followed a wait is most likely followed by
            # EAGAIN (or, from a pipe, by _drained()), whose wait is the loop's
            # turn; any other read gets one.
            short = len(data) < self._asking
            turned = short and waited
            self._asking = self._slow_bytes if short else self._read_bytes
        self.ended.set()
        await self._pipeline.finish()
        if failure is not None:
            raise InputError(failure.strerror or str(failure)) from failure

    def _drained(self) -> bool:
        """True if fd is a pipe that holds no byte now (FIONREAD) and epoll
        never said it was hung up: then a read would only raise EAGAIN, whose
        exception costs more than this test, and the next byte, or the last
        writer's close, brings an edge.  False when unsure (not a pipe: a
        terminal's end of file holds no byte and may bring no edge)."""
        if not self._fifo or self._hung_up:
            return False
        fcntl.ioctl(self._fd, termios.FIONREAD, self._queued_bytes)
        return self._queued_bytes == b"\0\0\0\0"

    def _read_ready(self) -> bytes | None:
        """The next bytes of stdin if some are ready (b"" at EOF), else None.

        After a read that did not fill what it asked for, the next asks for at
        most SLOW_READ_BYTES (until one fills that): malloc serves a buffer that
        small from its heap, while one of the full read size is mapped, shrunk
        and unmapped again for every line that trickles in."""
        try:
            return os.read(self._fd, self._asking)
        except BlockingIOError:
            return None
        except OSError as exc:
            if exc.errno == errno.EIO:
                return b""
            raise

    def _read_packet(self) -> bytes | None:
        """_read_ready for a SEQPACKET or datagram socket: the next packet whole.
        A peek with MSG_TRUNC returns the waiting packet's full length, and the
        read asks for at least that (a packet larger than the read would lose
        its rest).  An empty packet reads as EOF, as it always did."""
        try:
            size = self._packet_socket.recv_into(
                self._peeked, 1, socket.MSG_PEEK | socket.MSG_TRUNC | socket.MSG_DONTWAIT)
            return os.read(self._fd, max(size, self._asking))
        except BlockingIOError:
            return None

    async def _read_after_wait(self) -> bytes:
        """The next bytes of stdin, waiting on epoll for them; b"" at EOF or
        when stopped."""
        while not self._stopping:
            self._waiter = self._loop.create_future()
            await self._waiter
            self._waiter = None
            if self._window and self._within_window():
                await self._wait_out_window()
            data = self._read_ready()
            if data is not None:
                return data
        return b""

    def _within_window(self) -> bool:
        """True if this edge should wait for the window to end: the last read was
        less than a window ago and the run goes on.  Once per window or more,
        measures the input rate and sets the window to what half of stdin's
        buffer holds at that rate (at most --coalesce; 0 below a millisecond)."""
        now = time.time()
        elapsed = now - self._rate_since
        if elapsed >= self._window:
            fills_half = self._capacity / 2 * elapsed / max(1, self._rate_bytes)
            self._pace = min(self._window, fills_half) if fills_half >= MIN_WINDOW else 0.0
            self._rate_since, self._rate_bytes = now, 0
        return now - self._read_at < self._pace and not self._stopping \
            and not self._hung_up and not self._backlogged()

    def _backlogged(self) -> bool:
        """True if stdin already holds a quarter of its buffer (FIONREAD): input
        comes faster than zmqpush takes it, which a window would only slow."""
        try:
            fcntl.ioctl(self._fd, termios.FIONREAD, self._queued_bytes)
        except OSError:
            return False
        return int.from_bytes(self._queued_bytes, sys.byteorder) >= self._capacity // 4

    async def _wait_out_window(self):
        """Sleep until a window after the last read, stdin watched for a hang-up
        only; stop() or a hang-up ends it early.  Then stdin is watched for reads
        again, and the edge that brings (data came meanwhile) is taken here: the
        read that follows takes that data."""
        delay = min(self._pace, self._pace - (time.time() - self._read_at))
        self._epoll.modify(self._fd, _HANGUP_EDGES)
        self._waiter = self._loop.create_future()
        self._window_timer = self._loop.call_later(delay, self._wake)
        try:
            await self._waiter
        finally:
            self._window_timer.cancel()
            self._window_timer = self._waiter = None
            self._epoll.modify(self._fd, _READ_EDGES)
            self._note_hangups()

    def _note_hangups(self):
        """Take the epoll's pending events, noting a hang-up."""
        for _, events in self._epoll.poll(0):
            if events & _HANGUP_EVENTS:
                self._hung_up = True


# --------------------------------------------------------------- spooling --
# Owns the disk spool (--spool): the directory's lock, records in segment
# files, the position file, the cap and flushing; and the queue and replay
# window that keep their place in it.

SPOOL_MAGIC = b"\xffZPr"  # 0xFF never occurs in the UTF-8 JSON of a message
# A record's header: magic, payload length, CRC-32 of the time and the payload,
# the time it was written.  Its payload: n, n message lengths and n event
# counts (u32 each), n line-end flags (a byte each), then the messages.
SPOOL_HEADER = struct.Struct("<4sIId")
SPOOL_COUNT = struct.Struct("<I")
SEGMENT_NAME = re.compile(r"^(\d{20})\.seg$")
SPOOL_FILES = ("lock", "position", "held", "held.new")  # and the segments
MAX_SEGMENT_BYTES = 16 << 20
# After a write error the spool is full until it is tried again this much later.
SPOOL_RETRY = 1.0
# The position file is rewritten at most this often, the first time at once (a
# stale one only means that a new run sends again a little of what was done;
# a run killed soon after its start must still leave its progress there).
POSITION_DELAY = 0.1
SCAN_BYTES = 64 << 10  # a damaged stretch is searched for the next record in these


class SpoolError(Exception):
    """The spool directory cannot be used at start: one line, exit 2."""


def _little_endian(numbers) -> bytes:
    """numbers as u32 in the spool's byte order (little-endian)."""
    import array
    values = array.array("I", numbers)
    if sys.byteorder == "big":
        values.byteswap()
    return values.tobytes()


def encode_record(parcel: Parcel, when: float) -> list:
    """parcel's record (header first) as buffers for one os.writev."""
    import zlib
    head = SPOOL_COUNT.pack(len(parcel.messages))
    sizes = _little_endian(map(len, parcel.messages))
    counts = _little_endian(parcel.events)
    ends = bytes(parcel.ends_line)
    body = b"".join(parcel.messages)
    stamp = struct.pack("<d", when)
    crc = zlib.crc32(stamp)
    for part in (head, sizes, counts, ends, body):
        crc = zlib.crc32(part, crc)
    length = len(head) + 9 * len(parcel.messages) + len(body)
    return [SPOOL_HEADER.pack(SPOOL_MAGIC, length, crc, when), head, sizes, counts, ends,
            body]


def decode_payload(payload: bytes) -> tuple | None:
    """(messages, events, ends_line) of a record's payload whose checksum
    holds, or None if its parts do not add up."""
    import array
    count = SPOOL_COUNT.unpack_from(payload)[0] if len(payload) >= 4 else -1
    first = 4 + 9 * count
    if count < 0 or first > len(payload):
        return None
    sizes, counts = array.array("I"), array.array("I")
    sizes.frombytes(payload[4:4 + 4 * count])
    counts.frombytes(payload[4 + 4 * count:4 + 8 * count])
    if sys.byteorder == "big":
        sizes.byteswap()
        counts.byteswap()
    if sum(sizes) != len(payload) - first:
        return None
    starts = itertools.accumulate(sizes, initial=first)
    messages = [payload[at:at + size] for at, size in zip(starts, sizes)]
    return messages, counts.tolist(), list(payload[4 + 8 * count:first])


class Spool:
    """The spool directory: records in append-only segment files, a position
    file and a lock file.  Owns every file in it.

    Positions are byte offsets in one endless log; a segment file is named by
    the offset of its first byte.  `end` is where the next record goes.
    Records before `safe` are done (delivered, or past the replay window):
    segments wholly before it are deleted, `nbytes` is what the others take.
    `position` (at least `safe`) is where a new run starts: records before it
    are past what a receiver's host can still hold (see SpoolWindow); the
    position file holds it, lagging at most POSITION_DELAY.  A run writes its
    own segments (a torn record a crash left at the end of the last one is
    never appended to).

    append() writes a record with one writev and flushes per `sync`: 0 after
    every write, inf never (the OS decides), else at most `sync` seconds after
    a write (one timer, armed by the first write after a flush).  The cap, a
    full disk or any write error make the spool full: append() refuses (what
    a failed write left is cut off), the error is said once, and SPOOL_RETRY
    later writing is tried again.  read() skips what is torn or damaged (its
    checksum fails) to the next good record, counting each such stretch in
    counters.spool_corrupt: nothing damaged is ever sent."""

    def __init__(self, directory: str, cap: int, sync: float, counters):
        self.directory = directory
        self.cap = cap
        self._sync = sync
        self._counters = counters
        self._segment_bytes = max(64 << 10, min(MAX_SEGMENT_BYTES, cap // 8))
        self._loop = asyncio.get_running_loop()
        self._flush_timer: asyncio.TimerHandle | None = None
        self._position_timer: asyncio.TimerHandle | None = None
        self._room_waiters: list = []
        self._error_until = 0.0
        self._errors_said: set = set()
        self.past_cap = False  # set when reading stops (see SpoolQueue.take_past_cap)
        self._write_fd: int | None = None
        self._new_entry = False  # a segment was created since the last flush
        self._read_fd: int | None = None
        self._read_start = -1
        try:
            os.makedirs(directory, 0o700, exist_ok=True)
            self._refuse_foreign()
            self._lock_fd = self._lock()
            self._position_fd = os.open(self._path("position"),
                                        os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
            self._starts, self._sizes = self._segments()
            self.safe = self._read_position()
            self._done = self.safe  # see position
            self._position_written = -POSITION_DELAY  # (monotonic time)
        except OSError as exc:
            raise SpoolError(f"cannot use --spool {directory}: "
                             f"{exc.strerror or exc}") from None
        last = self._starts[-1] + self._sizes[self._starts[-1]] if self._starts else 0
        self.end = max(self.safe, last)
        self.found = self.end  # what a previous run left lies before this
        self._delete_done()

    def _path(self, name: str) -> str:
        return os.path.join(self.directory, name)

    def _refuse_foreign(self):
        """SpoolError, before anything is created or opened, unless the directory
        holds only what a spool writes: regular files named `lock`, `position`
        (digits and a newline; zeros or nothing where a crash tore the write),
        `held` and `held.new` (see keep_held) or like a segment.  A spool
        never takes over, follows or changes what someone else left (a FIFO
        named like a segment would block its open)."""
        for name in sorted(os.listdir(self.directory)):
            path = self._path(name)
            ours = name in SPOOL_FILES or SEGMENT_NAME.match(name)
            if not ours or not stat.S_ISREG(os.lstat(path).st_mode) or (
                    name == "position" and not self._holds_a_position(path)):
                raise SpoolError(f"cannot use --spool {self.directory}: {name!r} in it is not "
                                 "a spool's file (give a new or empty directory, or a spool)")

    @staticmethod
    def _holds_a_position(path: str) -> bool:
        """True if the regular file at path reads as a position file."""
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        try:
            return not os.pread(fd, 64, 0).strip(b"0123456789\n\0")
        finally:
            os.close(fd)

    def _lock(self) -> int:
        """The lock file's descriptor, flock()ed; SpoolError if another run holds it."""
        fd = os.open(self._path("lock"), os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip()
            os.close(fd)
            raise SpoolError(f"--spool {self.directory} is in use by another zmqpush"
                             + (f" (pid {holder})" if holder.isdigit() else "")) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, b"%d\n" % os.getpid(), 0)
        return fd

    def _segments(self) -> tuple:
        """(sorted segment starts, {start: size}) of the segment files in the
        directory (regular files named like segments; anything else is left be)."""
        sizes = {}
        for name in os.listdir(self.directory):
            match = SEGMENT_NAME.match(name)
            if match:
                info = os.lstat(self._path(name))
                if stat.S_ISREG(info.st_mode):
                    sizes[int(match.group(1))] = info.st_size
        return sorted(sizes), sizes

    def _segment_path(self, start: int) -> str:
        return self._path(f"{start:020d}.seg")

    def _read_position(self) -> int:
        """The position file's offset; 0 (everything) if it is missing or damaged."""
        found = re.fullmatch(rb"0*(\d{1,18})\n", os.pread(self._position_fd, 64, 0))
        return int(found[1]) if found else 0  # (as written: 20 digits, like segment names)

    # -- writing

    def failing(self) -> bool:
        """True while append() refuses after a write error (see _failed)."""
        return time.monotonic() < self._error_until

    def full(self) -> bool:
        """True while append() would refuse: at the cap, or after a write error."""
        return ((self.nbytes >= self.cap and not self.past_cap)
                or time.monotonic() < self._error_until)

    @property
    def nbytes(self) -> int:
        return sum(self._sizes.values())

    @property
    def segments(self) -> int:
        return len(self._starts)

    def append(self, parcel: Parcel) -> Parcel | None:
        """Write parcel's record; parcel with its place (start, end), or None
        when the spool is full (the cap, or a write error: said once)."""
        if time.monotonic() < self._error_until:
            return None
        record = encode_record(parcel, time.time())
        size = sum(map(len, record))
        held = self.nbytes
        if held and held + size > self.cap and not self.past_cap:
            return None
        try:
            if self._write_fd is None or self._sizes[self._starts[-1]] >= self._segment_bytes:
                self._open_segment()
            written = os.writev(self._write_fd, record)
            if written < size:
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            if self._sync == 0:
                os.fdatasync(self._write_fd)
        except OSError as exc:
            self._failed(exc)
            return None
        start = self.end
        self.end += size
        self._sizes[self._starts[-1]] += size
        if 0 < self._sync < float("inf") and self._flush_timer is None:
            self._flush_timer = self._loop.call_later(self._sync, self._flush)
        return parcel._replace(start=start, end=self.end)

    def _open_segment(self):
        """Flush and close the segment being written, if any; start one at end."""
        self._close_segment()
        fd = os.open(self._segment_path(self.end),
                     os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW,
                     0o600)
        self._write_fd = fd
        if not self._starts or self._starts[-1] != self.end:
            self._starts.append(self.end)
            self._sizes[self.end] = 0
        self._new_entry = True
        if self._sync == 0:
            self._sync_directory()

    def _close_segment(self):
        if self._write_fd is not None:
            fd, self._write_fd = self._write_fd, None
            try:
                if self._sync < float("inf"):
                    os.fdatasync(fd)
            finally:
                os.close(fd)

    def _sync_directory(self):
        """Make a new segment's directory entry durable too."""
        self._new_entry = False
        fd = os.open(self.directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _flush(self):
        self._flush_timer = None
        try:
            if self._write_fd is not None:
                os.fdatasync(self._write_fd)
            if self._new_entry:
                self._sync_directory()
        except OSError as exc:
            self._failed(exc)

    def _failed(self, exc: OSError):
        """A write failed: cut off what it left, be full for SPOOL_RETRY, say it once."""
        if self._write_fd is not None and self._starts:
            try:
                os.ftruncate(self._write_fd, self._sizes[self._starts[-1]])
            except OSError:
                self._close_segment_quietly()
        self._error_until = time.monotonic() + SPOOL_RETRY
        if exc.errno not in self._errors_said:
            self._errors_said.add(exc.errno)
            warn(f"spool {self.directory}: cannot write ({exc.strerror or exc}): "
                 f"treated as full, tried again every {SPOOL_RETRY:g} s")

    def held_found(self) -> list:
        """What the stages held when a previous run ended (see keep_held):
        one list of lines (bytes, without newline) per stage, the first
        stage's first; [] if none, or if the file does not read as keep_held
        writes it.  A file without the stages' counts is the first stage's."""
        try:
            fd = os.open(self._path("held"), os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return []
        try:
            data = os.read(fd, os.fstat(fd).st_size)
        finally:
            os.close(fd)
        lines, at = [], SPOOL_COUNT.size
        count = SPOOL_COUNT.unpack_from(data)[0] if len(data) >= at else 0
        for _ in range(count):
            if at + SPOOL_COUNT.size > len(data):
                return []
            size = SPOOL_COUNT.unpack_from(data, at)[0]
            lines.append(data[at + SPOOL_COUNT.size:at + SPOOL_COUNT.size + size])
            at += SPOOL_COUNT.size + size
        if at > len(data) or (len(data) - at) % SPOOL_COUNT.size:
            return []
        counts = [SPOOL_COUNT.unpack_from(data, at + i)[0]
                  for i in range(0, len(data) - at, SPOOL_COUNT.size)] or [count]
        if sum(counts) != count:
            return []
        groups, start = [], 0
        for size in counts:
            groups.append(lines[start:start + size])
            start += size
        return groups

    def keep_held(self, groups: list):
        """Record what the stages hold (one list of lines per stage, bytes
        without newline, oldest first) in the file `held`, replacing what it
        held: its lines, then each stage's count of them; written whole to
        held.new and renamed over it, so that a kill leaves the one or the
        other whole; flushed as segments are with --spool-sync write; none
        held, the file is removed.  A write error is said once (what it held
        is then lost only if zmqpush is killed while holding it)."""
        lines = [line for group in groups for line in group]
        data = SPOOL_COUNT.pack(len(lines)) + b"".join(
            SPOOL_COUNT.pack(len(line)) + line for line in lines) + b"".join(
            SPOOL_COUNT.pack(len(group)) for group in groups)
        try:
            if not lines:
                self._remove_held()
                return
            fd = os.open(self._path("held.new"),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view):]
                if self._sync == 0:
                    os.fdatasync(fd)
            finally:
                os.close(fd)
            os.rename(self._path("held.new"), self._path("held"))
            if self._sync == 0:
                self._sync_directory()
        except OSError as exc:
            if exc.errno not in self._errors_said:
                self._errors_said.add(exc.errno)
                warn(f"spool {self.directory}: cannot keep held lines in it "
                     f"({exc.strerror or exc})")

    def _remove_held(self):
        try:
            os.unlink(self._path("held"))
        except FileNotFoundError:
            return
        if self._sync == 0:
            self._sync_directory()

    def _close_segment_quietly(self):
        try:
            os.close(self._write_fd)
        except OSError:
            pass
        self._write_fd = None

    async def room(self):
        """Wait until append() may succeed again: segments were deleted, or
        SPOOL_RETRY passed after a write error."""
        waiter = self._loop.create_future()
        self._room_waiters.append(waiter)
        retry = None
        left = self._error_until - time.monotonic()
        if left > 0:
            retry = self._loop.call_later(left, self.wake_room)
        try:
            await waiter
        finally:
            if retry is not None:
                retry.cancel()

    def wake_room(self):
        """Wake what waits in room()."""
        waiters, self._room_waiters = self._room_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    # -- done records

    def release(self, upto: int):
        """Records before upto are done: move `safe` there, delete the
        segments wholly before it, and write the position file soon."""
        if upto <= self.safe:
            return
        self.safe = upto
        if self._delete_done():
            self.wake_room()
        self._position_soon()

    @property
    def position(self) -> int:
        """Where a new run on the spool starts (see the class)."""
        return max(self.safe, self._done)

    def move_position(self, to: int):
        """Make `to` the position (never before `safe`): forward as
        records get past what a receiver can lose, back when a receiver went
        away; written to the position file soon.  Nothing is deleted."""
        if to != self._done:
            self._done = to
            self._position_soon()

    def _position_soon(self):
        """Write the position file now if it was not written for POSITION_DELAY
        (a run killed soon after its start keeps its progress), else once
        that much time has passed since."""
        if self._position_timer is not None:
            return
        wait = self._position_written + POSITION_DELAY - time.monotonic()
        if wait <= 0:
            self._write_position()
        else:
            self._position_timer = self._loop.call_later(wait, self._write_position)

    def _delete_done(self) -> bool:
        """Delete the segments wholly before `safe`; True if any was."""
        deleted = False
        while self._starts and self._starts[0] + self._sizes[self._starts[0]] <= self.safe:
            start = self._starts.pop(0)
            del self._sizes[start]
            if not self._starts and self._write_fd is not None:
                self._close_segment_quietly()
            if start == self._read_start:
                os.close(self._read_fd)
                self._read_fd, self._read_start = None, -1
            try:
                os.unlink(self._segment_path(start))
            except OSError:
                pass  # gone already, or not ours to delete: its place is released all the same
            deleted = True
        return deleted

    def _write_position(self):
        self._position_timer = None
        self._position_written = time.monotonic()
        try:
            os.pwrite(self._position_fd, b"%020d\n" % self.position, 0)
        except OSError:
            pass  # a stale position only sends again what was done

    # -- reading

    def read(self, position: int) -> tuple:
        """(the record at position as a Parcel, where the next one starts).
        The Parcel is None where no good record starts at position (a gap,
        or a torn or damaged stretch, counted): the next position is then the
        next good record, or the end of that segment."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0 or position >= self._starts[index] + self._sizes[self._starts[index]]:
            later = self._starts[index + 1:]
            return None, later[0] if later else self.end
        start = self._starts[index]
        limit = start + self._sizes[start]
        try:
            parcel = self._record_at(start, position, limit)
            if parcel is not None:
                return parcel, parcel.end
            nxt = self._next_good(start, position + 1, limit)
        except FileNotFoundError:  # deleted by someone else: its lines are gone
            parcel, nxt = None, limit
        except OSError as exc:
            raise SpoolError(f"spool {self.directory}: cannot read segment {start:020d} "
                             f"({exc.strerror or exc}): stopping; the spool keeps it "
                             "for the next run") from None
        self._counters.spool_corrupt += 1
        if self._counters.spool_corrupt == 1:
            warn(f"spool {self.directory}: skipping a damaged or torn record "
                 f"(segment {start:020d}, offset {position - start}); "
                 "further ones are only counted")
        return None, nxt

    def _record_at(self, start: int, position: int, limit: int) -> Parcel | None:
        """The good record at position of segment start, else None."""
        import zlib
        fd = self._reader(start)
        header = os.pread(fd, SPOOL_HEADER.size, position - start)
        if len(header) < SPOOL_HEADER.size:
            return None
        magic, length, crc, _ = SPOOL_HEADER.unpack(header)
        end = position + SPOOL_HEADER.size + length
        if magic != SPOOL_MAGIC or end > limit:
            return None
        payload = os.pread(fd, length, position - start + SPOOL_HEADER.size)
        if len(payload) < length or zlib.crc32(payload, zlib.crc32(header[12:])) != crc:
            return None
        decoded = decode_payload(payload)
        if decoded is None:
            return None
        messages, events, ends = decoded
        return parcel_of(messages, events, ends)._replace(start=position, end=end)

    def _next_good(self, start: int, position: int, limit: int) -> int:
        """The first good record of segment start from position on, else limit."""
        fd = self._reader(start)
        while position < limit:
            chunk = os.pread(fd, min(SCAN_BYTES, limit - position), position - start)
            if not chunk:
                return limit
            found = chunk.find(SPOOL_MAGIC)
            while found >= 0:
                if self._record_at(start, position + found, limit) is not None:
                    return position + found
                found = chunk.find(SPOOL_MAGIC, found + 1)
            position += max(1, len(chunk) - len(SPOOL_MAGIC) + 1)
        return limit

    def _reader(self, start: int) -> int:
        """A descriptor to read segment start (one is kept open)."""
        if start != self._read_start:
            if self._read_fd is not None:
                os.close(self._read_fd)
                self._read_fd, self._read_start = None, -1
            self._read_fd = os.open(self._segment_path(start), os.O_RDONLY)
            self._read_start = start
        return self._read_fd

    def age(self, position: int) -> float:
        """Seconds since the record at position was written (0 if none is there)."""
        index = bisect.bisect_right(self._starts, position) - 1
        if index < 0 or position >= self.end:
            return 0.0
        try:
            header = os.pread(self._reader(self._starts[index]), SPOOL_HEADER.size,
                              position - self._starts[index])
            magic, _, _, when = SPOOL_HEADER.unpack(header)
        except (OSError, struct.error):
            return 0.0
        return max(0.0, time.time() - when) if magic == SPOOL_MAGIC else 0.0

    def close(self, done: bool):
        """End the run: everything is done if `done` (then no segment is
        left); flush, write the position, close every file (the lock too)."""
        if done:
            self.release(self.end)
        for timer in (self._flush_timer, self._position_timer):
            if timer is not None:
                timer.cancel()
        try:
            self._close_segment()
        except OSError as exc:
            warn(f"spool {self.directory}: cannot flush ({exc.strerror or exc})")
        self._write_position()
        for fd in (self._read_fd, self._position_fd, self._lock_fd):
            if fd is not None:
                os.close(fd)
        self._read_fd, self._read_start = None, -1


class SpoolQueue(ByteQueue):
    """The queue with a spool behind it.  Every Parcel goes to the spool first
    (spool_nowait, put); it is also kept in memory, up to maxsize bytes, while
    memory holds everything not yet sent, so a receiver that keeps up is fed
    from memory and the spool is only written.  Otherwise the sender's gets
    read the spool back from `cursor`, the next record neither sent nor in
    memory: what a previous run left comes first (counted read as it is
    read), then what this run spooled, in order.  END comes after all of it.
    When the spool refuses a Parcel (see _memory_only_nowait) it may be kept
    in memory only: such a Parcel has no place in the spool (end 0).

    rewind() (a receiver went away) drops what memory holds and reads again
    from an earlier position; records up to the position handed last then
    come back as replayed Parcels.  `rewinds` counts the rewinds."""

    durable = True

    def __init__(self, maxsize: int, spool: Spool, counters, memory_only: bool = True):
        super().__init__(maxsize)
        self._spool = spool
        self._counters = counters
        self.memory_only = memory_only  # see _memory_only_nowait
        self.cursor = spool.safe
        self.rewinds = 0
        self._replay_until = 0
        self._found_read = spool.safe  # what a previous run left was read up to here
        self._end_put = False
        self._end_given = False

    def offer(self, parcel: Parcel) -> bool:
        """The sink's offer (see ByteQueue): spool_nowait."""
        return self.spool_nowait(parcel)

    def spool_nowait(self, parcel: Parcel) -> bool:
        """Spool parcel (and keep it in memory if it may be), or, when the
        spool is full, keep it in memory only if it may be (see
        _memory_only_nowait); False if neither."""
        spool = self._spool
        caught_up = self.cursor == spool.end
        placed = spool.append(parcel)
        if placed is None:
            return self._memory_only_nowait(parcel, caught_up)
        if caught_up and self.nbytes < self.bound:
            ByteQueue.put_nowait(self, placed)
            self.cursor = placed.end
        elif self._getters:
            self._wake(self._getters)  # the sender reads it from the spool
        return True

    def _memory_only_nowait(self, parcel: Parcel, caught_up: bool) -> bool:
        """The spool refused parcel: keep it in memory only, unspooled (end
        0), counted in counters.events_memory_only, if memory_only allows
        it, the refusal was a write error (a full disk: not the cap, where
        --when-full decides), and the sender has taken everything before it
        (order holds); False otherwise.  A receiver that takes the lines
        thus never waits on a disk that has no room, and one that does not
        leaves at most this Parcel in memory only."""
        if not (self.memory_only and caught_up and not self._parcels
                and self._spool.failing()):
            return False
        ByteQueue.put_nowait(self, parcel)
        self._counters.events_memory_only += sum(parcel.events)
        return True

    async def put(self, item):
        """Spool item, waiting while neither the spool nor memory may take
        it (see spool_nowait); END: after all spooled.  Cancelled (the run
        ended while the spool could not write), item's events are counted in
        counters.events_unspooled."""
        if item is END:
            self._end_put = True
            self._wake(self._getters)
            return
        try:
            while not self.spool_nowait(item):
                await self._room()
        except asyncio.CancelledError:
            self._counters.events_unspooled += sum(item.events)
            raise

    async def _room(self):
        """Wait until the spool may take a record again (see Spool.room), or
        the sender took something (memory may have room, or the spool is
        read to its end)."""
        loop = asyncio.get_running_loop()
        taken = loop.create_future()
        self._putters.append(taken)
        room = loop.create_task(self._spool.room())
        try:
            await asyncio.wait((taken, room), return_when=asyncio.FIRST_COMPLETED)
        finally:
            room.cancel()
            taken.cancel()
            if taken in self._putters:
                self._putters.remove(taken)

    def empty(self) -> bool:
        return (not self._parcels and self.cursor >= self._spool.end
                and (self._end_given or not self._end_put))

    def full(self) -> bool:
        return self._spool.full()

    async def get(self):
        """ByteQueue.get(), except that damage read to the spool's end (which
        empty() counted as something) means waiting on, not QueueEmpty."""
        while True:
            try:
                return await super().get()
            except asyncio.QueueEmpty:
                continue

    def get_nowait(self):
        """The next Parcel from memory, else from the spool; END once, after
        everything; QueueEmpty if there is nothing."""
        if self._parcels:
            return ByteQueue.get_nowait(self)
        spool = self._spool
        while self.cursor < spool.end:
            parcel, self.cursor = spool.read(self.cursor)
            if parcel is not None:
                if self._putters and self.cursor >= spool.end:
                    self._wake(self._putters)  # caught up: see _memory_only_nowait
                return self._marked(parcel)
        if self._end_put and not self._end_given:
            self._end_given = True
            return END
        raise asyncio.QueueEmpty

    def _marked(self, parcel: Parcel) -> Parcel:
        """parcel as read back: replayed up to what was handed at the last
        rewind; counted read the first time if a previous run left it."""
        if parcel.end <= self._replay_until:
            return parcel._replace(replayed=True)
        if parcel.start < self._spool.found and parcel.end > self._found_read:
            events = sum(parcel.events)
            self._counters.events_read += events
            self._counters.events_found += events
            self._found_read = parcel.end
        return parcel

    def keep_held(self, groups: list):
        """See Spool.keep_held: a kill loses no line held."""
        self._spool.keep_held(groups)

    def held_found(self) -> list:
        """See Spool.held_found."""
        return self._spool.held_found()

    def take_past_cap(self):
        """Reading stops: what the reader still holds goes to the spool past
        its cap (a write error still refuses), so that nothing read is lost."""
        self._spool.past_cap = True
        self._spool.wake_room()

    def rewind(self, position: int, handed_end: int):
        """Send again from position; records up to handed_end are replayed.
        What memory holds is dropped (it is read again from the spool), except
        Parcels kept in memory only, which the spool cannot give again."""
        kept = [parcel for parcel in self._parcels if not parcel.end]
        self._parcels.clear()
        self._parcels.extend(kept)
        self.nbytes = sum(parcel.nbytes for parcel in kept)
        self.cursor = position
        self._replay_until = max(self._replay_until, handed_end)
        self.rewinds += 1
        self._wake(self._getters)

    def memory_only_events(self) -> int:
        """Events of the Parcels kept in memory only that it holds."""
        return sum(sum(parcel.events) for parcel in self._parcels
                   if parcel is not END and not parcel.end)

    def unsent_bytes(self) -> int:
        """Spool bytes from the cursor on (not sent, not in memory)."""
        return self._spool.end - self.cursor

    def oldest_unsent(self) -> int:
        """Where the oldest record not yet taken by the sender lies."""
        return next((parcel.start for parcel in self._parcels if parcel.end), self.cursor)


# ---------------------------------------------------------------- sockets --
# Owns the PUSH sockets: socket options, endpoints, descriptors and their limit,
# connection monitors, one socket per receiver with several -c (Link, Fanout),
# and closing.  CURVE and ZAP are in the security section.

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
    """Set the socket options that make outages safe (see README "Outages"),
    bound what a peer can make us hold, and apply the security options."""
    import zmq
    sock.setsockopt(zmq.SNDHWM, config.sndhwm)
    sock.setsockopt(zmq.LINGER, -1)
    # A PUSH socket receives only handshake commands, a few hundred bytes: a peer
    # announcing a larger frame is dropped before it is buffered, and one that
    # never finishes its handshake is dropped after HANDSHAKE_MS.
    sock.setsockopt(zmq.MAXMSGSIZE, PEER_FRAME_MOST)
    sock.setsockopt(zmq.HANDSHAKE_IVL, HANDSHAKE_MS)
    # Queue only for connected receivers when something can replace a queue that
    # dies with its connection: rsyslog (--confirm) or the replay window.
    sock.setsockopt(zmq.IMMEDIATE, 1 if config.confirm or config.replay_bytes else 0)
    sock.setsockopt(zmq.RECONNECT_IVL, RECONNECT_IVL_MS)
    if config.bind:
        sock.setsockopt(zmq.BACKLOG, BIND_BACKLOG)
    sock.setsockopt(zmq.RECONNECT_IVL_MAX, RECONNECT_IVL_MAX_MS)
    if config.replay_bytes:
        sock.setsockopt(zmq.SNDBUF, REPLAY_SNDBUF)
    if any(endpoint.startswith("tcp://[") for endpoint in config.connect + config.bind):
        sock.setsockopt(zmq.IPV6, 1)  # a bracketed IPv6 address; ZeroMQ's default is IPv4 only
    if config.heartbeat:
        ivl = max(1, int(config.heartbeat * 1000))
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
    apply_security(sock, config.security)


# ZeroMQ's errors for an endpoint that can never work, whatever the network does.
_ENDPOINT_USAGE_ERRNOS = (errno.EINVAL, errno.EPROTONOSUPPORT, errno.ENODEV,
                          errno.ENAMETOOLONG)


def endpoint_error_code(exc: OSError) -> int:
    """Exit code for open_stream's OSError: 2 for an endpoint that is unusable as
    written (bad address, ipc path too long), 1 for the rest (address in use)."""
    return EXIT_USAGE if exc.errno in _ENDPOINT_USAGE_ERRNOS else EXIT_ERROR


async def open_stream(config: Config, context, on_socket=None):
    """A connected (or bound) aiozmq PUSH stream on a socket of context.
    on_socket(sock), if given, is called before any endpoint is used (a monitor
    then misses no event) and returns what must be closed before the socket.
    OSError from ZeroMQ on a bad or unusable endpoint; the socket is closed then."""
    import zmq
    aiozmq = import_aiozmq()
    sock = context.socket(zmq.PUSH)
    configure_socket(sock, config)
    watcher = on_socket(sock) if on_socket is not None else None
    try:
        stream = await aiozmq.create_zmq_stream(
            zmq.PUSH, zmq_sock=sock, bind=config.bind or None,
            connect=config.connect or None,
            high_write=config.write_high, low_write=config.write_low)
    except OSError:
        if watcher is not None:
            watcher.close()
        sock.close(linger=0)
        raise
    return stream


class Closing(NamedTuple):
    """Closes each of parts in turn (what open_stream closes if it fails)."""

    parts: tuple

    def close(self):
        for part in self.parts:
            part.close()


class Doorkeeper:
    """--bind when peers took nearly every open file: closes the door to
    further peers so that libzmq does not spin on them.

    libzmq takes a peer that it cannot accept (EMFILE) for a passing failure:
    the peer stays in the listen queue, whose descriptor stays ready, and the
    I/O thread tries accept() again at every wake-up (a core busy for as long
    as the peer waits).  Closed, the door is a socket filter on each listening
    socket (libzmq's, known from its LISTENING event; a duplicate) that drops
    every packet, so new peers' SYNs go unanswered (they retry, backing off);
    the peers already queued are drained: accepted and at once closed, with
    one of BIND_RESERVE descriptors kept for that given up for each (a
    BIND_BACKLOG-long listen queue needs no more: one libzmq wins instead is
    a peer admitted).  The door opens again when a peer leaves and enough
    descriptors are free."""

    def __init__(self):
        self._listeners: list = []  # sockets on duplicates of libzmq's listening descriptors
        self._reserve: list = []
        self.closed = False
        self.refused = 0  # queued peers turned away

    def listening(self, fd: int):
        """libzmq listens on fd (its LISTENING event).  A duplicate of it is
        kept (closing it leaves libzmq's alone), made non-blocking, which the
        two share (libzmq, which accepts when epoll says so, takes EAGAIN for a
        peer that went away)."""
        listener = socket.socket(fileno=os.dup(fd))
        listener.setblocking(False)
        self._listeners.append(listener)
        self._restock()

    def close_door(self):
        """Drop new peers' packets, turn away the queued ones."""
        if not self.closed:
            self.closed = True
            for listener in self._listeners:
                set_drop_filter(listener, True)
        for listener in self._listeners:
            self._drain(listener)

    def open_door(self):
        """Let new peers in again."""
        self._restock()
        if self.closed:
            self.closed = False
            for listener in self._listeners:
                set_drop_filter(listener, False)

    def close(self):
        """Stop (libzmq's listening descriptors stay open)."""
        for listener in self._listeners:
            listener.close()
        self._listeners = []
        for fd in self._reserve:
            os.close(fd)
        self._reserve = []

    def _restock(self):
        """Keep BIND_RESERVE descriptors in reserve, as far as some are free."""
        try:
            while len(self._reserve) < BIND_RESERVE:
                self._reserve.append(os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC))
        except OSError:
            pass

    def _drain(self, listener: socket.socket):
        """Accept and close the peers queued on listener, giving up a reserve
        descriptor whenever none is left."""
        for _ in range(BIND_BACKLOG + BIND_RESERVE + 1):
            try:
                listener.accept()[0].close()
                self.refused += 1
                continue
            except BlockingIOError:
                return
            except OSError as exc:
                if exc.errno not in (errno.EMFILE, errno.ENFILE) or not self._reserve:
                    return
            os.close(self._reserve.pop())


def set_drop_filter(listener: socket.socket, drop: bool):
    """Attach to listener a classic BPF program that drops every packet
    (BPF_RET|BPF_K 0), or detach it.  Linux; elsewhere nothing is done."""
    try:
        if not drop:
            listener.setsockopt(socket.SOL_SOCKET, SO_DETACH_FILTER, 0)
            return
        import ctypes
        program = ctypes.create_string_buffer(struct.pack("HBBI", 0x06, 0, 0, 0))
        listener.setsockopt(socket.SOL_SOCKET, SO_ATTACH_FILTER,
                            struct.pack("@HP", 1, ctypes.addressof(program)))
    except (OSError, ImportError):
        pass


class Connections:
    """Which receivers are connected, from a ZeroMQ socket monitor on the PUSH
    socket, watched by the loop (no timer: with no receiver it never wakes).

    Counts receivers connected now and disconnects in counters; calls
    on_event(what, endpoint) for each event worth saying, and on_lost(endpoint,
    takes_messages) when a receiver that had completed its handshake goes
    away (see Shipper._on_receiver_lost); knows the TCP
    descriptor of each connection (CONNECTED and ACCEPTED carry it) to tell
    what the kernel has not had acknowledged.  (aiozmq's own monitor misses
    events over inproc with this loop and can block at close.)  Only the events
    used are asked for, so libzmq never has to send a "monitor stopped" event at
    the end, and failed reconnect attempts stay silent.  A failed handshake
    goes to on_failed_handshake(event, value, endpoint).  In --bind mode every
    peer shares the endpoint, and a refused peer or a port scan must not look
    like a receiver that went away: a DISCONNECTED is not one when it follows
    its connection's failed handshake (libzmq says both in a row), or when no
    handshake at all succeeded while that connection lived.  Otherwise it is
    one (when in doubt: a needless replay costs duplicates, a missed one may
    lose what was in flight)."""

    def __init__(self, sock, counters: Counters, on_event, on_lost, on_failed_handshake=None):
        import zmq
        self._zmq = zmq
        self._sock = sock
        self._said_full = False  # peers took nearly every descriptor (see _check_descriptors)
        self._doorkeeper = Doorkeeper()
        self._counters = counters
        self._on_event = on_event
        self._on_lost = on_lost
        self._on_failed_handshake = on_failed_handshake  # (event, value, endpoint)
        # A connection's DISCONNECTED is no receiver lost if it follows its failed
        # handshake, or if no handshake succeeded at all while it lived.
        self._failing = False
        self._successes = 0
        self._born: dict = {}  # TCP descriptor -> self._successes when it connected
        self._up: collections.Counter = collections.Counter()
        self._tcp_fds: set = set()
        self._monitor = sock.get_monitor_socket(
            zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED | zmq.EVENT_LISTENING
            | zmq.EVENT_CONNECTED | zmq.EVENT_ACCEPTED | zmq.EVENT_ACCEPT_FAILED
            | HANDSHAKE_FAILED_EVENTS)
        self._fd = self._monitor.getsockopt(zmq.FD)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._fd, self.read_events)
        self._loop.call_soon(self.read_events)

    def close(self, hear_left: bool = True):
        """Handle what is left if hear_left, then stop the monitor (before the
        socket closes)."""
        if self._monitor is None:
            return
        self._loop.remove_reader(self._fd)
        if hear_left:
            self.read_events()
        self._doorkeeper.close()
        if not self._sock.closed:
            self._sock.disable_monitor()
        self._monitor.close(linger=0)
        self._monitor = None

    def read_events(self):
        """Handle every monitor event ready now."""
        for head, endpoint in ready_messages(lambda: self._monitor, self._zmq):
            event = int.from_bytes(head[:2], sys.byteorder)
            value = int.from_bytes(head[2:6], sys.byteorder, signed=True)
            self._on_monitor_event(event, value, endpoint.decode(errors="replace"))

    def takes_messages(self) -> bool:
        """Whether the socket, having read its commands, would take a message now."""
        return bool(self._sock.getsockopt(self._zmq.EVENTS) & self._zmq.POLLOUT)

    def peers(self) -> int:
        """How many receivers are connected now (handshake done)."""
        return sum(self._up.values())

    def unsent_bytes(self) -> int:
        """Bytes the kernel holds unacknowledged on the TCP connections now."""
        total = 0
        for fd in self._tcp_fds:
            try:
                total += struct.unpack("i", fcntl.ioctl(fd, termios.TIOCOUTQ, b"\0" * 4))[0]
            except OSError:
                pass
        return total

    def _check_descriptors(self, endpoint: str | None):
        """At a --bind peer accepted or refused for want of a descriptor
        (endpoint) or gone (None): while peers leave fewer than
        DESCRIPTORS_SPARE open files, the door is closed to further ones (see
        Doorkeeper), said once; the peers connected keep getting lines."""
        import resource
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        try:
            used = len(os.listdir("/proc/self/fd"))
        except OSError:  # none left even for that
            used = limit
        if used + DESCRIPTORS_SPARE < limit:
            self._doorkeeper.open_door()
            return
        if endpoint is None:
            return
        self._doorkeeper.close_door()
        if not self._said_full:
            self._said_full = True
            warn(f"peers on {endpoint} take nearly every open file ({used} of {limit}, ulimit "
                 "-n): further peers are held off (they retry) until one leaves; the "
                 "connected ones go on")

    def _on_monitor_event(self, event: int, value: int, endpoint: str):
        zmq = self._zmq
        handshaken = True
        if event in (zmq.EVENT_CONNECTED, zmq.EVENT_ACCEPTED):
            self._tcp_fds.add(value)
            self._born[value] = self._successes
            if event == zmq.EVENT_ACCEPTED:
                self._check_descriptors(endpoint)
        elif event == zmq.EVENT_DISCONNECTED:
            self._tcp_fds.discard(value)
            handshaken = not self._failing and self._born.pop(value, -1) != self._successes
            self._failing = False
            if self._doorkeeper.closed:
                self._check_descriptors(None)
        elif event == zmq.EVENT_LISTENING:
            self._doorkeeper.listening(value)
        elif event == zmq.EVENT_ACCEPT_FAILED and value in (errno.EMFILE, errno.ENFILE):
            self._check_descriptors(endpoint)
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            self._successes += 1
            self._up[endpoint] += 1
            self._counters.connected += 1
            self._on_event("connected", endpoint)
        elif event == self._zmq.EVENT_DISCONNECTED and handshaken and self._up[endpoint] > 0:
            self._up[endpoint] -= 1
            self._counters.connected -= 1
            self._counters.disconnects += 1
            self._on_event("disconnected", endpoint)
            self._on_lost(endpoint, self.takes_messages)
        elif event & HANDSHAKE_FAILED_EVENTS:
            self._failing = True  # libzmq says DISCONNECTED next, for the same connection
            if self._on_failed_handshake is not None:
                self._on_failed_handshake(event, value, endpoint)


def socket_parts(config: Config) -> list:
    """The configs of the PUSH sockets to open: one for all endpoints when there
    is one endpoint or only --bind ones; otherwise one per -c endpoint, plus
    one for every --bind endpoint together (see Fanout)."""
    if len(config.connect) + bool(config.bind) <= 1:
        return [config]
    return ([config._replace(connect=[endpoint], bind=[]) for endpoint in config.connect]
            + ([config._replace(connect=[])] if config.bind else []))


# Descriptors and ZeroMQ sockets (README "Several receivers"), measured: what
# zmqpush opens besides its PUSH sockets (stdin, the epolls, the loop's pipes,
# ZeroMQ's I/O thread and reaper: 19), with room for a spool's files and
# --metrics-listen; what each PUSH socket opens (its mailbox and the mailboxes
# of its monitor's two PAIR sockets), and each connection (its TCP socket) or
# listener (and the Doorkeeper's duplicate).  Peers arriving on --bind take one
# each: the soft limit is raised to the hard one when it leaves fewer than
# BIND_PEERS_ROOM.
DESCRIPTORS_BASE = 32
DESCRIPTORS_PER_SOCKET = 3
ZMQ_SOCKETS_PER_SOCKET = 3  # the PUSH socket and its monitor's PAIR sockets
BIND_PEERS_ROOM = 256
DESCRIPTORS_SPARE = 8  # --bind peers past this are held off (Connections)
# --bind's listen queue, and the descriptors kept to turn away what it holds
# when the door closes (Doorkeeper); Linux's filter options.
BIND_BACKLOG = 8
BIND_RESERVE = BIND_BACKLOG + 1
SO_ATTACH_FILTER = 26
SO_DETACH_FILTER = 27
LIBZMQ_MAX_SOCKETS = 1023  # libzmq's default ZMQ_MAX_SOCKETS


def descriptors_needed(connect: int, bind: int) -> int:
    """The open files the sockets of `connect` -c and `bind` --bind endpoints
    need (one socket each past the first, see socket_parts), --bind peers not
    counted (their reserve is)."""
    sockets = max(1, connect + bool(bind))
    return (DESCRIPTORS_BASE + DESCRIPTORS_PER_SOCKET * sockets
            + connect + 2 * bind + (BIND_RESERVE if bind else 0))


def descriptor_shortfall(connect: int, bind: int) -> str | None:
    """Why even the hard RLIMIT_NOFILE cannot serve the sockets of `connect`
    -c and `bind` --bind endpoints (naming the limit, the need and `ulimit
    -n`), else None.  Checked while the options are read, before the memory
    bound, so that the exit-2 line is this one alone."""
    import resource
    need = descriptors_needed(connect, bind)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard >= need:
        return None
    endpoints = connect + bind
    return (f"{endpoints} endpoint{'s' if endpoints > 1 else ''} need {need} open "
            f"files, over the limit of {soft} (hard limit {hard}): raise it "
            f"(ulimit -n {need}; LimitNOFILE= for a service) or give fewer endpoints")


def raise_descriptor_limit(config: Config) -> str | None:
    """Raise the soft RLIMIT_NOFILE to the hard limit when it is short of what
    config needs (with BIND_PEERS_ROOM for --bind peers), as Go's runtime and
    systemd services do (parse_options refused a hard limit below the need:
    see descriptor_shortfall).  Returns why it cannot, else None."""
    import resource
    want = (descriptors_needed(len(config.connect), len(config.bind))
            + (BIND_PEERS_ROOM if config.bind else 0))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= want:
        return None
    try:
        infinite = hard == resource.RLIM_INFINITY
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if infinite else hard, hard))
    except (OSError, ValueError) as exc:
        return f"cannot raise the open files limit {soft} to {hard} (ulimit -n): {exc}"
    return None


def max_sockets(config: Config) -> int:
    """ZMQ_MAX_SOCKETS for the context of config's sockets: libzmq's default,
    or what the PUSH sockets and their monitors need if more."""
    return max(LIBZMQ_MAX_SOCKETS,
               ZMQ_SOCKETS_PER_SOCKET * len(socket_parts(config)) + 1)


def batch_sndhwm(zmq_bytes: int, array_bytes: int, max_line_bytes: int) -> int:
    """--batch's SNDHWM: as many messages as zmq_bytes holds, 4 at least.  A
    message is an array of array_bytes at most, or a line piece longer than
    that alone: past the default --max-line-bytes they are counted by the
    longest piece.  (At the default, the formula's room for the longest line
    covers ZeroMQ's lone long ones: 60 MiB peak measured, 64 KiB lines, a
    receiver stopped mid-stream.)"""
    largest = array_bytes if max_line_bytes <= DEFAULT_MAX_LINE_BYTES \
        else max(array_bytes, max_line_bytes)
    return max(4, zmq_bytes // largest)


def zmq_queue_bytes(batch: bool, replay: bool) -> int:
    """What ZeroMQ's queues may hold in all, in bytes, as --memory-bytes counts
    it: PIPE_BYTES in default mode; with --batch the arrays SNDHWM allows."""
    if not batch:
        return PIPE_BYTES
    return max(PIPE_BYTES, REPLAY_BATCH_ZMQ_BYTES if replay else BATCH_ZMQ_BYTES)


def own_context(config: Config) -> bool:
    """Whether config's socket needs a ZeroMQ context of its own: a bound one
    whose peers a ZAP handler checks (a context has one handler, RFC 27).  The
    others share one context, and so one I/O thread and one reaper."""
    return bool(config.bind) and config.security is not None and config.security.zap()


def endpoint_host_name(endpoint: str) -> str | None:
    """The host name of a tcp:// endpoint, None for an IP address or an ipc:// one."""
    match = ENDPOINT_RE.match(endpoint)
    if match is None or match.group(2) is None:
        return None
    host = match.group(2).strip("[]")
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return None
        except OSError:
            pass
    return host


def say_unresolved_names(endpoints: list, loop: asyncio.AbstractEventLoop):
    """Look up the host names of endpoints once, in a daemon thread (a lookup
    may take seconds, and must hold up neither the run nor its end), and say
    on stderr, from the loop, each that does not resolve: libzmq retries it
    quietly for ever (DNS may come up later), and would only look unconnected."""
    names = {host: endpoint for endpoint in endpoints
             for host in [endpoint_host_name(endpoint)] if host is not None}
    if not names:
        return

    def look_up():
        for host, endpoint in names.items():
            try:
                socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
            except (socket.gaierror, UnicodeError) as exc:
                reason = getattr(exc, "strerror", None) or str(exc)
                try:
                    loop.call_soon_threadsafe(
                        warn, f"cannot resolve {host} ({endpoint}): {reason}; "
                        "retrying every 1 s all the same (said once)")
                except RuntimeError:  # the loop is closed: the run is over
                    return

    threading.Thread(target=look_up, name="zmqpush-resolve", daemon=True).start()


def open_socket(config: Config, context, on_socket):
    """A PUSH socket of context, configured, watched (on_socket as for
    open_stream) and using config's endpoints: (socket, what on_socket returned).
    OSError on a bad or unusable endpoint; nothing stays open then."""
    import zmq
    sock = context.socket(zmq.PUSH)
    configure_socket(sock, config)
    watcher = on_socket(sock)
    try:
        for endpoint in config.bind:
            sock.bind(endpoint)
        for endpoint in config.connect:
            sock.connect(endpoint)
    except zmq.ZMQError as exc:
        watcher.close()
        sock.close(linger=0)
        raise OSError(exc.errno, exc.strerror) from exc
    return sock, watcher


class PushSocket:
    """The PUSH sockets from opening to closing: their options
    (configure_socket), their endpoints, the monitor of their connections
    (Connections), and closing within what is left of --linger.  One socket
    (an aiozmq stream) for one endpoint, or for --bind alone; one per -c
    endpoint otherwise, behind a Fanout (see socket_parts); all in one ZeroMQ
    context but a bound one with a ZAP handler (own_context).  `stream` is
    what the Sender writes to: the aiozmq stream or the Fanout."""

    def __init__(self, config: Config):
        self._config = config
        self.stream = None
        self._watchers: list = []  # (Connections, Gatekeeper) per socket
        self._sockets: list = []
        self._contexts: list = []
        self._shared = None  # the context of the sockets without a ZAP handler

    def _context_for(self, part: Config):
        """The context part's socket goes in: a new one if it needs its own
        (own_context), else the one the others share (made at the first)."""
        import zmq
        if own_context(part):
            self._contexts.append(zmq.Context())
            return self._contexts[-1]
        if self._shared is None:
            self._shared = zmq.Context()
            self._shared.set(zmq.MAX_SOCKETS, max_sockets(self._config))
            self._contexts.append(self._shared)
        return self._shared

    async def open(self, counters: Counters, on_event, on_lost):
        """Open the sockets, watch their connections (calling on_event(what,
        endpoint) and on_lost(endpoint, takes_messages), see Connections) and use their
        endpoints.  OSError from ZeroMQ on a bad or unusable endpoint (nothing
        stays open)."""
        def watch(part: Config):
            def watcher(sock):
                gatekeeper = Gatekeeper(sock, part.security, counters, part.connect, part.bind)
                connections = Connections(sock, counters, on_event, on_lost,
                                          gatekeeper.handshake_failed)
                self._watchers.append((connections, gatekeeper))
                return Closing((connections, gatekeeper))
            return watcher
        parts = socket_parts(self._config)
        try:
            if len(parts) == 1:
                self.stream = await open_stream(self._config, self._context_for(parts[0]),
                                                on_socket=watch(self._config))
                self._sockets = [self.stream.transport.get_extra_info("zmq_socket")]
                return
            for part in parts:
                sock, _ = open_socket(part, self._context_for(part), watch(part))
                self._sockets.append(sock)
        except OSError:
            self.stop_watching()
            for sock in self._sockets:
                sock.close(linger=0)
            for context in self._contexts:
                context.term()
            raise
        config = self._config
        receivers = [connections.peers if part.bind else (lambda: 1)
                     for part, (connections, _) in zip(parts, self._watchers)]
        self.stream = Fanout(list(zip(self._sockets, receivers)),
                             zmq_queue_bytes(config.batch, bool(config.replay_bytes)),
                             (config.write_high, config.write_low))

    def unsent_bytes(self) -> int:
        """Bytes the kernel holds unacknowledged on the TCP connections now."""
        return sum(connections.unsent_bytes() for connections, _ in self._watchers)

    def hear(self):
        """Handle the connection events ready now (see Connections.read_events)."""
        for connections, _ in self._watchers:
            connections.read_events()

    def stop_watching(self, hear_left: bool = True):
        """Stop the connection monitors and the gatekeepers (before the sockets
        close), first handling the events left if hear_left."""
        for connections, gatekeeper in self._watchers:
            connections.close(hear_left)
            gatekeeper.close()

    async def close(self, linger: float, buffered: bool, handed_any: bool) -> bool:
        """Close, letting ZeroMQ deliver for at most linger seconds (what is
        still buffered in the stream, if anything, is dropped).  True if ZeroMQ
        delivered all it held: its termination returned LINGER_MARGIN before the
        linger ran out, or it was never handed anything.  (A linger shorter than
        that margin cannot tell: False.)"""
        import zmq
        for sock in self._sockets:
            sock.setsockopt(zmq.LINGER, int(linger * 1000))
        if buffered:
            self.stream.transport.abort()
        else:
            self.stream.close()
        await asyncio.sleep(0)
        for sock in self._sockets:
            if not sock.closed:
                sock.close()
        began = time.monotonic()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, context.term)
                               for context in self._contexts))
        return not handed_any or time.monotonic() - began + LINGER_MARGIN < linger


class Link:
    """One PUSH socket of a Fanout and what ZeroMQ holds for it in bytes,
    bounded as ZeroMQHeld bounds one socket: every `pipe_bytes` / 8 handed,
    the next messages, one for each of its receivers (receivers(): one for a
    -c endpoint, the peers connected to its --bind endpoints), go zero-copy
    with a tracker (a checkpoint); once it is done, nothing handed to this
    socket before it is still queued.  The socket takes nothing more while
    what was handed since its oldest checkpoint not done would pass 7/8 of
    pipe_bytes: ZeroMQ holds at most about pipe_bytes for it, whatever the
    size of the lines."""

    def __init__(self, sock, pipe_bytes: int, receivers):
        import zmq
        self._zmq = zmq
        self._sock = self.socket = sock
        self._send = zmq.backend.Socket.send.__get__(sock)
        self._dontwait, self._again = zmq.DONTWAIT, zmq.Again
        self.fd = sock.getsockopt(zmq.FD)
        self._every = max(1, pipe_bytes // 8)
        self._bound = pipe_bytes - self._every
        self._receivers = receivers
        self._checkpoints: collections.deque = collections.deque()  # (handed before, trackers)
        self._handed = 0  # bytes handed to this socket in all
        self._since = 0  # of which since the newest checkpoint
        self._owed = 0  # messages the newest checkpoint has yet to track
        self._watched = None  # the tracker a thread waits on
        self._wake = None  # what that thread calls (on the loop) when it is done

    def over(self, nbytes: int) -> bool:
        """Whether handing nbytes more would pass the bound.  (The trackers
        are asked only when the oldest checkpoint kept, done or not, says so.)"""
        checkpoints = self._checkpoints
        if not checkpoints or self._handed + nbytes - checkpoints[0][0] <= self._bound:
            return False
        while checkpoints and all(tracker.done for tracker in checkpoints[0][1]):
            checkpoints.popleft()
        return bool(checkpoints) and (self._handed + nbytes - checkpoints[0][0] > self._bound)

    def take(self, message: bytes) -> bool:
        """Hand message to this socket if it is within the bound and ZeroMQ
        takes it now; False otherwise."""
        nbytes = len(message)
        since = self._since + nbytes
        if self._owed or since >= self._every:
            return self._take_tracked(message, nbytes)
        if self.over(nbytes):
            return False
        try:
            self._send(message, self._dontwait)
        except self._again:
            return False
        self._since = since
        self._handed += nbytes
        return True

    def take_run(self, messages: list, first: int) -> int:
        """Hand messages from messages[first] on to this socket while it is
        within the bound and ZeroMQ takes them, up to and including the next
        message of a checkpoint; returns the next index."""
        if self.over(0):
            return first
        send, flags, sent = self._send, self._dontwait, first
        room = self._every - self._since  # bytes before a checkpoint is due
        refused = False
        if not self._owed:
            try:
                for message in messages[first:] if first else messages:
                    if len(message) >= room:
                        break
                    send(message, flags)
                    room -= len(message)
                    sent += 1
            except self._again:
                refused = True
            taken = self._every - self._since - room
            self._since += taken
            self._handed += taken
        if not refused and sent < len(messages) and self.take(messages[sent]):
            sent += 1
        return sent

    def _take_tracked(self, message: bytes, nbytes: int) -> bool:
        """take() for a message of a checkpoint, which goes with a tracker."""
        if self.over(nbytes):
            return False
        frame = self._zmq.Frame(message, copy=False, track=True)
        try:
            self._send(frame, self._dontwait, copy=False)
        except self._again:
            return False
        if not self._owed:
            self._checkpoints.append((self._handed, []))
            self._owed = max(1, self._receivers())
            self._since = 0
        else:
            self._since += nbytes
            if not self._checkpoints:  # the one being made was done so far: go on anew
                self._checkpoints.append((self._handed, []))
        self._checkpoints[-1][1].append(frame.tracker)
        self._owed -= 1
        self._handed += nbytes
        return True

    def may_take(self, wake) -> bool:
        """Whether the socket may take a message now; if not because of the
        bound, wake() is called (on the loop) once its oldest checkpoint is done."""
        if self.over(0):  # then the oldest checkpoint kept is not done
            tracker = next(t for t in self._checkpoints[0][1] if not t.done)
            self._wake = wake
            if tracker is not self._watched:
                self._watched = tracker
                threading.Thread(target=self._wait_and_wake,
                                 args=(tracker, asyncio.get_running_loop()),
                                 name="zmqpush-checkpoint", daemon=True).start()
            return False
        return bool(self._sock.getsockopt(self._zmq.EVENTS) & self._zmq.POLLOUT)

    def _wait_and_wake(self, tracker, loop):
        tracker.wait()
        try:
            loop.call_soon_threadsafe(self._done_waiting)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def _done_waiting(self):
        wake, self._wake = self._wake, None
        if wake is not None:
            wake()


class Fanout:
    """Several PUSH sockets, one per receiver, as one stream with aiozmq's
    interface as the Sender uses it (write, drain, buffer size and limits,
    close, abort; `transport` is itself).

    One PUSH socket does not tell which receiver took a message, so one
    socket with several receivers cannot bound in bytes what it queues for
    each.  Here each socket (Link) has one receiver and its own bound;
    send() does what libzmq does inside one socket: round-robin over the
    sockets that can take a message now, skipping one whose receiver is
    stopped, slow or gone once its queue is full (SNDHWM messages or its
    share of the bytes): its share goes to the others.  The Sender's direct
    sends (send_from) take turns by runs of messages (at most a checkpoint
    apart, see Link.take_run), so their loop costs about what one socket's
    does; a line a read still alternates line by line.  The bytes are
    shared evenly: with n sockets each may hold pipe_bytes / n.

    What send() cannot hand over now, write() buffers; the buffer is sent in
    order as sockets become able to take it (their descriptors, or a thread
    waiting on a checkpoint, wake the loop)."""

    def __init__(self, sockets: list, pipe_bytes: int, limits: tuple):
        """sockets: (socket, receivers()) pairs (see Link)."""
        import zmq
        self._again = zmq.Again
        self.transport = self
        self._links = [Link(sock, pipe_bytes // len(sockets), receivers)
                       for sock, receivers in sockets]
        self._next = 0
        self._high, self._low = limits
        self._buffer: collections.deque = collections.deque()
        self._size = 0
        self._pump: asyncio.Task | None = None
        self._drained: list = []  # futures of drain() calls
        self._failure: BaseException | None = None  # what ended sending the buffer

    def send(self, message: bytes, flags: int = 0):
        """Hand message to the next socket, in round-robin order, that takes it
        now; zmq.Again if none does.  (flags: for the Sender's call; always
        DONTWAIT.)"""
        links, count = self._links, len(self._links)
        for _ in range(count):
            link = links[self._next]
            self._next = self._next + 1 if self._next + 1 < count else 0
            if link.take(message):
                return
        raise self._again()

    def sockets(self) -> list:
        """The PUSH sockets, one per receiver."""
        return [link.socket for link in self._links]

    def send_from(self, messages: list, first: int) -> int:
        """Hand messages from messages[first] on over in order, a run at a
        time (see Link.take_run) to each socket in turn that takes one, until
        none does; returns the next index.  (Runs rather than single messages:
        the loop over a run costs about what one socket's does.)"""
        links, count = self._links, len(self._links)
        sent, refusals = first, 0
        while sent < len(messages) and refusals < count:
            link = links[self._next]
            self._next = self._next + 1 if self._next + 1 < count else 0
            taken = link.take_run(messages, sent)
            refusals = 0 if taken > sent else refusals + 1
            sent = taken
        return sent

    def get_write_buffer_limits(self) -> tuple:
        return self._low, self._high

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None):
        self._high = self._high if high is None else high
        self._low = self._low if low is None else low

    def get_write_buffer_size(self) -> int:
        return self._size

    def write(self, frames: list):
        """Send the one-frame messages in frames now, or buffer them in order."""
        for frame in frames:
            if not self._buffer:
                try:
                    self.send(frame)
                    continue
                except self._again:
                    pass
            self._buffer.append(frame)
            self._size += len(frame)
        if self._buffer and self._pump is None:
            self._pump = asyncio.get_running_loop().create_task(self._send_buffer())

    async def drain(self):
        """Wait until the buffer holds at most the low limit (raises what
        ended sending it, if anything did)."""
        if self._failure is not None:
            raise self._failure
        if self._size > self._low:
            future = asyncio.get_running_loop().create_future()
            self._drained.append(future)
            await future

    async def _send_buffer(self):
        try:
            while self._buffer:
                try:
                    self.send(self._buffer[0])
                except self._again:
                    await self._writable()
                    continue
                self._size -= len(self._buffer.popleft())
                if self._size <= self._low:
                    self._wake_drains(None)
        except Exception as exc:  # whoever drains fails with it
            self._failure = exc
            self._wake_drains(exc)
        finally:
            self._pump = None

    def _wake_drains(self, exc: BaseException | None):
        drained, self._drained = self._drained, []
        for future in drained:
            if future.done():
                continue
            if exc is None:
                future.set_result(None)
            else:
                future.set_exception(exc)

    async def _writable(self):
        """Wait until some socket may take a message (ZeroMQ's descriptors
        signal edges only: they are watched before the sockets are asked)."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()

        def wake():
            if not future.done():
                future.set_result(None)
        for link in self._links:
            loop.add_reader(link.fd, wake)
        try:
            if not any([link.may_take(wake) for link in self._links]):
                await future
        finally:
            for link in self._links:
                loop.remove_reader(link.fd)

    def abort(self):
        """Drop what is buffered."""
        if self._pump is not None:
            self._pump.cancel()
        self._buffer.clear()
        self._size = 0
        self._wake_drains(None)

    def close(self):
        """Nothing is buffered: nothing to do (the sockets close with PushSocket)."""


# ---------------------------------------------------------------- sending --
# Owns what is handed to ZeroMQ and what becomes of it: the replay window and
# its policy (memory or spool), ZeroMQ's held queue, flow control (Sender),
# confirm mode's replies (Confirmer), and --stdout's writer (StdoutWriter).

class ReplayWindow:
    """What may still be in flight to a receiver, and what is done with it.

    Keeps the Parcels handed to ZeroMQ most recently by reference (no copy):
    the newest whose nbytes add up to at least `limit` (so it may exceed it by
    one Parcel), dropping the oldest; limit 0 keeps nothing (at-most-once, the
    original's behaviour).

    When a receiver goes away, replay() puts all of it at the head of the queue,
    to be sent again.  When receivers have taken what was in flight, the
    window is emptied (quiet checks): that is taken to be when two checks
    REPLAY_QUIET apart, the sender idle all that time, both find that ZeroMQ
    refused nothing since the check before (no backpressure) and that the
    kernel holds nothing unacknowledged on any connection.  One timer serves
    the checks: armed when the sender goes idle with a window and none is
    armed, it finds out at its turn whether the sender worked meanwhile, so
    a busy sender arms and cancels nothing per Parcel; a backlogged receiver
    costs two wake-ups a second, an idle one none."""

    def __init__(self, limit: int, queue: ByteQueue, unsent_bytes, stop_hearing):
        self.limit = limit
        self.nbytes = 0
        self._parcels: collections.deque = collections.deque()
        self._queue = queue
        self._unsent_bytes = unsent_bytes
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._idle = False
        self._worked = False  # the sender took a Parcel since the last check
        self._pressed = False  # ZeroMQ refused a message since the last check
        self._calm_checks = 0
        self._stop_hearing = stop_hearing  # see replays_awaited
        self._replays_due = 0  # replays announced, not yet done (see replay_due)
        self._replays_announced = 0
        self._no_replay_due: asyncio.Future | None = None

    def replay_due(self):
        """A receiver went away: replay() comes soon (see Shipper._on_receiver_lost)."""
        self._replays_due += 1
        self._replays_announced += 1

    def replay_done(self):
        """One replay announced by replay_due() was done."""
        self._replays_due -= 1
        if not self._replays_due and self._no_replay_due is not None:
            self._no_replay_due.set_result(None)
            self._no_replay_due = None

    async def replays_awaited(self) -> bool:
        """Input ended and the sender sent everything: wait until no replay is
        due (see replay_due); True if one was, and the sender sends what it
        put back, then asks again.  With none due, stop_hearing() is called
        first: it takes in the receivers lost so far, whose replays become
        due, or if there were none stops hearing them.  So False comes only
        once no replay can become due any more: a receiver heard going away
        always has its replay sent, within --linger."""
        if not self._replays_due:
            announced = self._replays_announced
            self._stop_hearing()
            if self._replays_announced == announced:
                return False
        if self._replays_due:
            if self._no_replay_due is None:
                self._no_replay_due = self._loop.create_future()
            await asyncio.shield(self._no_replay_due)
        return True

    def add(self, parcel: Parcel):
        """Keep parcel, just handed to ZeroMQ, dropping the oldest past the limit."""
        if not self.limit:
            return
        self._parcels.append(parcel)
        self.nbytes += parcel.nbytes
        while self.nbytes - self._parcels[0].nbytes >= self.limit:
            self.nbytes -= self._parcels.popleft().nbytes

    def pressed(self):
        """ZeroMQ refused a message (backpressure)."""
        self._pressed = True

    def sender_idle(self):
        """The sender waits on an empty queue with nothing in the transport."""
        self._idle = True
        if self.nbytes and self._timer is None:
            self._timer = self._loop.call_later(REPLAY_QUIET, self._check_quiet)

    def sender_busy(self):
        """The sender took a Parcel."""
        self._idle = False
        self._worked = True

    def _check_quiet(self):
        """One quiet check (see the class): a check that finds the sender
        worked since the one before starts the count again."""
        self._timer = None
        if self._worked or not self._idle:
            self._calm_checks = 0
        else:
            calm = not self._pressed and not self._unsent_bytes()
            self._calm_checks = self._calm_checks + 1 if calm else 0
        self._worked = self._pressed = False
        if self._calm_checks >= 2:
            self._calm_checks = 0
            self._take()
        elif self._idle and self.nbytes:
            self._timer = self._loop.call_later(REPLAY_QUIET, self._check_quiet)

    def replay(self, in_progress: Parcel | None) -> int:
        """A receiver went away: put the window, then in_progress (what was
        handed of the Parcel being sent), at the head of the queue as replayed
        Parcels (see replay_parcels).  Nothing once the window was emptied.
        Returns the events requeued."""
        if not self.limit:
            return 0
        parcels = self._take()
        if in_progress is not None:
            parcels.append(in_progress)
        replays = replay_parcels(parcels, self.limit)
        for replay in reversed(replays):
            self._queue.put_first(replay)
        return sum(sum(replay.events) for replay in replays)

    def _take(self) -> list:
        """Every Parcel held, oldest first; the window is empty afterwards."""
        parcels, self._parcels, self.nbytes = list(self._parcels), collections.deque(), 0
        return parcels


class SpoolWindow(ReplayWindow):
    """The replay window with a spool: it keeps where the records handed
    lately lie, not their messages, so it costs no memory; replay() rewinds
    the SpoolQueue to the oldest.  The spool's `safe` follows the window's
    oldest record or, once the window is emptied (see ReplayWindow), the end
    of what was handed.

    The spool's position (where a new run starts, after a crash) follows
    what a receiver can no longer lose: the records handed before the newest
    `held_bytes()` of them, what a receiver's host and our side can hold at
    most (RECEIVER_KERNEL_BYTES, REPLAY_SNDBUF, and STOCK_RCVHWM plus SNDHWM
    messages of the average size handed lately), never more than the window.
    So every run that hands more than that makes progress, whatever the
    window's size.  When a receiver goes away, the position goes back to
    where the replay starts."""

    def __init__(self, limit: int, queue: SpoolQueue, unsent_bytes, stop_hearing, *,
                 spool: Spool, sndhwm: int):
        super().__init__(limit, queue, unsent_bytes, stop_hearing)
        self._spool = spool
        self._handed_end = spool.safe
        self._messages_held = STOCK_RCVHWM + sndhwm
        # The newest records handed: (start, spool bytes, messages), and their totals
        self._recent: collections.deque = collections.deque()
        self._recent_bytes = self._recent_messages = 0

    def held_bytes(self) -> int:
        """Spool bytes of the newest records handed that a receiver's host
        and our own buffers may still hold (see the class)."""
        average = self._recent_bytes / max(1, self._recent_messages)
        return min(self.limit, RECEIVER_KERNEL_BYTES + REPLAY_SNDBUF
                   + int(self._messages_held * average))

    def _follow(self, parcel: Parcel):
        """Move the spool's position past the records no receiver can lose."""
        recent = self._recent
        recent.append((parcel.start, parcel.end - parcel.start, len(parcel.messages)))
        self._recent_bytes += parcel.end - parcel.start
        self._recent_messages += len(parcel.messages)
        held = self.held_bytes()
        while self._recent_bytes - recent[0][1] >= held:
            _, size, messages = recent.popleft()
            self._recent_bytes -= size
            self._recent_messages -= messages
        if self._recent_bytes >= held:
            self._spool.move_position(recent[0][0])

    def add(self, parcel: Parcel):
        """parcel (with its place in the spool) was handed to ZeroMQ; one
        kept in memory only (end 0) has no place to come back to."""
        if not parcel.end:
            return
        self._handed_end = parcel.end
        if not self.limit:
            self._spool.release(parcel.end)
            return
        self._parcels.append((parcel.start, parcel.nbytes, sum(parcel.events)))
        self.nbytes += parcel.nbytes
        while self.nbytes - self._parcels[0][1] >= self.limit:
            self.nbytes -= self._parcels.popleft()[1]
        self._spool.release(self._parcels[0][0])
        self._follow(parcel)

    def replay(self, in_progress: Parcel | None) -> int:
        """A receiver went away: rewind the queue to the window's oldest
        record (or to the Parcel in progress).  Returns the events that will
        be sent again."""
        if not self.limit:
            return 0
        if in_progress is not None and not in_progress.end:
            in_progress = None  # kept in memory only: the sender goes on with it
        events = sum(entry[2] for entry in self._parcels)
        if self._parcels:
            start = self._parcels[0][0]
        elif in_progress is not None:
            start = in_progress.start
        else:
            return 0
        if in_progress is not None:
            events += sum(in_progress.events)
        self._parcels.clear()
        self.nbytes = 0
        self._forget_recent()
        self._spool.move_position(start)
        self._queue.rewind(start, self._handed_end)
        return events

    def _forget_recent(self):
        self._recent.clear()
        self._recent_bytes = self._recent_messages = 0

    def _take(self) -> list:
        """Empty the window: everything handed is done."""
        self._parcels.clear()
        self.nbytes = 0
        self._forget_recent()
        self._spool.release(self._handed_end)
        return []


class ZeroMQHeld:
    """What ZeroMQ's queue holds, in bytes: SNDHWM counts messages, and a
    sender ahead of a slow receiver must not let ZeroMQ hold SNDHWM large ones.

    Every CHECKPOINT_BYTES handed, the next messages, one for each receiver
    ZeroMQ may queue for (from as many Parcels as that takes), go zero-copy
    with a tracker: a checkpoint.  ZeroMQ gives consecutive messages to its
    receivers in turn, frees a message once it is in the kernel (or its
    receiver is gone), and each receiver's queue is first in, first out, so
    once a checkpoint is done, nothing handed before it is still queued.
    Parcels wait (room()) while what was handed since the oldest checkpoint
    not done passes PIPE_BYTES - CHECKPOINT_BYTES: ZeroMQ holds at most about
    PIPE_BYTES plus one Parcel.  (So a receiver that stops taking lines holds
    up every receiver of the socket once the bound is reached: see Fanout for
    one socket per -c.)  (Lowering SNDHWM instead stalls libzmq 4.3 for good: see
    Sender.)  Owns the checkpoints: (bytes handed before, trackers), oldest
    first."""

    def __init__(self, frame, send_frame, flags: int, receivers):
        self._frame, self._send_frame, self._flags = frame, send_frame, flags
        self._receivers = receivers  # how many receivers ZeroMQ may queue for now
        self._checkpoints: collections.deque = collections.deque()
        self._handed = 0  # bytes (Parcel.nbytes) handed in all
        self._since = 0  # of which since the newest checkpoint
        self._owed = 0  # messages the newest checkpoint has yet to track

    def due(self, nbytes: int) -> bool:
        """Whether a Parcel of nbytes needs over() and checkpoint(): a
        checkpoint is due, or one is not known to be done."""
        return bool(self._checkpoints) or self._since + nbytes >= CHECKPOINT_BYTES

    def over(self, nbytes: int) -> bool:
        """Whether handing nbytes more would pass the bound."""
        checkpoints = self._checkpoints
        while checkpoints and all(tracker.done for tracker in checkpoints[0][1]):
            checkpoints.popleft()
        return bool(checkpoints) and (self._handed + nbytes - checkpoints[0][0]
                                      > PIPE_BYTES - CHECKPOINT_BYTES)

    async def room(self):
        """Wait until what was handed since the oldest checkpoint not done is
        half the bound at most, so a sender ahead of its receiver waits once
        per about PIPE_BYTES / 2.  A daemon thread waits on each tracker (it
        has no descriptor) and wakes the loop."""
        loop = asyncio.get_running_loop()
        while self.over((PIPE_BYTES - CHECKPOINT_BYTES) // 2):
            tracker = next(t for t in self._checkpoints[0][1] if not t.done)
            done = loop.create_future()
            threading.Thread(target=self._wait_and_wake, args=(tracker, loop, done),
                             name="zmqpush-checkpoint", daemon=True).start()
            await done

    @staticmethod
    def _wait_and_wake(tracker, loop, done):
        tracker.wait()
        try:
            loop.call_soon_threadsafe(lambda: done.done() or done.set_result(None))
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def checkpoint(self, parcel: Parcel) -> int:
        """How many of parcel's first messages go tracked, for the newest
        checkpoint or a new one that is due (0: none)."""
        if not self._owed:
            if self._since + parcel.nbytes < CHECKPOINT_BYTES:
                return 0
            self._since = -parcel.nbytes
            self._checkpoints.append((self._handed, []))
            self._owed = max(1, self._receivers())
        return min(len(parcel.messages), self._owed)

    def send_tracked(self, message: bytes):
        """Hand message over zero-copy, tracked in the newest checkpoint
        (raises zmq.Again: then the message goes untracked, and the next
        one is tracked in its place)."""
        frame = self._frame(message, copy=False, track=True)
        self._send_frame(frame, self._flags, copy=False)
        if not self._checkpoints:  # the one being made was done so far: go on anew
            self._checkpoints.append((self._handed, []))
        self._checkpoints[-1][1].append(frame.tracker)
        self._owed -= 1

    def handed(self, nbytes: int):
        """A Parcel of nbytes was handed over."""
        self._handed += nbytes
        self._since += nbytes


class Sender:
    """Flow control: takes Parcels from the queue and hands their messages to
    ZeroMQ, in order, keeping each handed Parcel in the ReplayWindow.

    Messages go straight to the socket with DONTWAIT.  When ZeroMQ would block,
    the sender spills messages into the aiozmq transport's buffer until that
    buffer passes its low watermark (or a message goes straight through again),
    then awaits drain() until aiozmq has sent all of the spill (the transport's
    limits are lowered to zero for that wait, so drain() returns exactly when
    the buffer is empty), then goes back to direct sends.  It takes nothing
    from the queue meanwhile, so what it holds is one Parcel plus at most the
    low watermark and one message.

    aiozmq sends its buffer one message per event-loop turn, about ten times
    the cost of a direct send: hence the default low watermark of 0 (spill only
    the refused message) and the backend's send, which skips pyzmq's wrapper.

    ZeroMQ's own queue counts messages, not bytes, and SNDHWM is never changed
    on a live socket: libzmq 4.3 acknowledges reads every (SNDHWM + 1) // 2
    messages, counted modulo the mark in force, so a mark lowered below what
    was sent since the last acknowledgement stalls the pipe for good.  In
    default mode ZeroMQHeld bounds ZeroMQ's queue in bytes instead; in batch
    mode the arrays are capped.
    """

    def __init__(self, stream, queue: ByteQueue, counters: Counters, window: ReplayWindow,
                 config: Config):
        import zmq
        self._again = zmq.Again
        self._dontwait = zmq.DONTWAIT
        self._frame = zmq.Frame
        self._stream = stream
        self._transport = stream.transport
        self._sock = None if isinstance(stream, Fanout) else \
            stream.transport.get_extra_info("zmq_socket")
        fanout = isinstance(stream, Fanout)  # it bounds each socket's queue itself
        self._fanout = stream if fanout else None
        self._send_frame = stream.send if fanout else \
            zmq.backend.Socket.send.__get__(self._sock)  # bytes only
        self._low, self._high = self._transport.get_write_buffer_limits()
        self._queue = queue
        self._counters = counters
        self.window = window
        self._held = None if config.batch or fanout else ZeroMQHeld(
            self._frame, self._send_frame, self._dontwait,
            lambda: len(config.connect) + (counters.connected if config.bind else 0))
        self._current: Parcel | None = None
        self._handed = 0  # messages of _current handed to ZeroMQ so far
        self._passed = 0  # of _current handed to ZeroMQ or written into the transport
        self._replayed_to = 0  # of _current put back by replays (see take_handed_part)
        # (bytes written to the transport so far, events in that message, replayed)
        self._in_transport: collections.deque = collections.deque()
        self._written_bytes = 0

    async def run(self) -> int:
        """Send Parcels until END, then until the queue (replays) and the
        transport buffer are empty and no replay is due or can become due
        (see ReplayWindow.replays_awaited).  Returns the queue's rewinds by then."""
        while True:
            parcel = await self.next_parcel()
            if parcel is END:
                break
            if not self.send_at_once(parcel):
                await self.send(parcel)
        while True:
            await self._send_what_is_queued()
            await self.flush()
            if not await self.window.replays_awaited():
                return self._queue.rewinds

    async def _send_what_is_queued(self):
        """Send the Parcels in the queue now, without waiting for more."""
        while True:
            try:
                parcel = self._queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            if not self.send_at_once(parcel):
                await self.send(parcel)

    async def next_parcel(self):
        """The next Parcel (or END) from the queue; while it waits on an empty
        queue with nothing in the transport the sender is idle (the window's
        quiet checks run then)."""
        queue = self._queue
        if not queue.empty():
            try:
                return queue.get_nowait()
            except asyncio.QueueEmpty:  # a spool's damage, read to its end, held nothing
                pass
        if not self._transport.get_write_buffer_size():
            self.window.sender_idle()
        parcel = await queue.get()
        self.window.sender_busy()
        return parcel

    def send_at_once(self, parcel: Parcel) -> bool:
        """Hand all of parcel over and keep it in the replay window, if that
        needs no wait: no checkpoint is due (see ZeroMQHeld) and ZeroMQ takes
        every message.  Otherwise False, and send() goes on from what was
        handed.  (The common case at any rate, done without a coroutine.)"""
        held = self._held
        self._current, self._passed, self._replayed_to = parcel, 0, 0
        if held is not None and held.due(parcel.nbytes):
            self._handed = 0
            return False
        self._handed = self.send_now(parcel.messages, parcel.events, 0, parcel.replayed)
        if self._handed < len(parcel.messages):
            return False
        self._sent(parcel)
        return True

    async def send(self, parcel: Parcel):
        """Hand the rest of parcel's messages over in order, after
        send_at_once() (waits while ZeroMQ would block), then keep parcel in
        the replay window.  If the queue was rewound meanwhile (a spool's
        replay), the rest of parcel is left: the rewound queue gives all of it
        again."""
        messages, events = parcel.messages, parcel.events
        rewinds = self._queue.rewinds
        held, tracked = self._held, 0
        if not self._handed and held is not None and held.due(parcel.nbytes):
            if held.over(parcel.nbytes):
                self.window.pressed()
                await held.room()
                if self._queue.rewinds != rewinds and parcel.end:
                    self._leave(parcel)  # none of it handed: the rewound queue has it
                    return
            tracked = held.checkpoint(parcel)
        while self._handed < len(messages):
            sent = self.send_now(messages, events, self._handed, parcel.replayed, tracked)
            self._handed = sent
            if sent < len(messages):
                self.window.pressed()
                spilled = self._passed = self.spill(messages, events, sent, parcel.replayed)
                await self.flush()
                self._handed = spilled
                if self._queue.rewinds != rewinds and parcel.end:
                    self._leave(parcel)
                    return
        self._sent(parcel)

    def _sent(self, parcel: Parcel):
        """All of parcel was handed to ZeroMQ."""
        if self._held is not None:
            self._held.handed(parcel.nbytes)
        self._current = None
        self.window.add(parcel)

    def _leave(self, parcel: Parcel):
        """parcel is left half sent after a rewind: what was handed of it
        counts as replayed, since the rewound queue gives it again whole."""
        self._current = None
        if not parcel.replayed:
            handed = sum(parcel.events[:self._handed])
            self._counters.events_handed -= handed
            self._counters.events_replayed += handed

    def unhanded_events(self, spooled: bool) -> int:
        """Events of the Parcel being sent not yet handed to ZeroMQ, if it is
        spooled (spooled True) or kept in memory only (False), else 0."""
        current = self._current
        if current is None or bool(current.end) != spooled:
            return 0
        return sum(current.events[self._handed:])

    def take_handed_part(self) -> Parcel | None:
        """What was handed to ZeroMQ of the Parcel being sent, or written into
        the transport (which may have handed it meanwhile), and not taken by
        a replay before, if anything (a replay puts it back once)."""
        current, start = self._current, self._replayed_to
        end = max(self._handed, self._passed)
        if current is None or end <= start:
            return None
        self._replayed_to = end
        return current._replace(messages=current.messages[start:end],
                                events=current.events[start:end],
                                ends_line=current.ends_line[start:end])

    def send_now(self, messages: list, events: list, first: int,
                 replayed: bool = False, tracked: int = 0) -> int:
        """Send from messages[first] on until ZeroMQ would block, those before
        messages[tracked] as a checkpoint (see ZeroMQHeld); returns the next index."""
        send, flags, sent = self._send_frame, self._dontwait, first
        try:
            if self._fanout is not None:
                sent = self._fanout.send_from(messages, first)
            while sent < tracked:
                self._held.send_tracked(messages[sent])
                sent += 1
            for message in messages[sent:] if sent else messages:
                send(message, flags)
                sent += 1
        except self._again:
            pass
        if replayed:
            self._counters.events_replayed += sum(events[first:sent])
        else:
            self._counters.events_handed += sum(events[first:sent])
        return sent

    def _count_handed(self, events: int, replayed: bool):
        if replayed:
            self._counters.events_replayed += events
        else:
            self._counters.events_handed += events

    def spill(self, messages: list, events: list, first: int, replayed: bool = False,
              whole: bool = False) -> int:
        """Write messages into the transport until its buffer passes the low
        watermark, or until one goes straight through (ZeroMQ takes them again);
        all of them if whole.  Returns the next index."""
        index = first
        while index < len(messages):
            self._transport.write([messages[index]])
            self._written_bytes += len(messages[index])
            self._in_transport.append((self._written_bytes, events[index], replayed))
            index += 1
            if not whole and not 0 < self._transport.get_write_buffer_size() <= self._low:
                break
        return index

    async def flush(self):
        """Wait until aiozmq has handed its whole buffer to ZeroMQ."""
        if self._transport.get_write_buffer_size():
            self._counters.drain_waits += 1
            self._transport.set_write_buffer_limits(high=0, low=0)
            try:
                await self._stream.drain()
            finally:
                self._transport.set_write_buffer_limits(high=self._high, low=self._low)
        self.settle()

    def settle(self):
        """Count events that left the transport buffer for ZeroMQ."""
        sent_bytes = self._written_bytes - self._transport.get_write_buffer_size()
        while self._in_transport and self._in_transport[0][0] <= sent_bytes:
            _, events, replayed = self._in_transport.popleft()
            self._count_handed(events, replayed)

    def buffered_bytes(self) -> int:
        return self._transport.get_write_buffer_size()

    def written_bytes(self) -> int:
        """Bytes written into the transport so far (see spill)."""
        return self._written_bytes

    def sent_bytes(self) -> int:
        """Bytes written into the transport so far that left it for ZeroMQ."""
        return self._written_bytes - self._transport.get_write_buffer_size()

    def hear_io_thread(self):
        """Let ZeroMQ take in what its I/O thread told it (that messages left its
        queue): a send does that at most about once a millisecond, reading a
        socket's EVENTS at once.  With a queue of one message (--confirm) a send
        right after another is refused until then."""
        import zmq
        for sock in self._fanout.sockets() if self._fanout is not None else [self._sock]:
            sock.getsockopt(zmq.EVENTS)


class Confirmer:
    """--confirm (rsyslog omprog confirmMessages) without a spool: the sender
    loop that answers each line read, "OK" once ZeroMQ accepted all of it,
    otherwise a refusal that makes rsyslog send it again; "OK" first of all,
    when ready.

    A line waits for ZeroMQ at most patience() seconds: the timeout while a
    receiver is connected, at most the first second before one ever was, and
    none while none is after that: then a line ZeroMQ does not take at once is
    refused at once, not after the timeout: rsyslog
    waits for each reply before anything else, its shutdown included (its
    queue workers get about 2.5 s before they are cancelled), so a reply
    that nothing could turn into "OK" is not made to wait.

    With --multiline, Answered items carry lines zmqpush answers itself (see
    Ledger): their events are never refused; the Ledger takes lines only
    once admits() says so."""

    def __init__(self, sender: Sender, replies: Replies, patience, counters: Counters,
                 queue: ByteQueue | None = None):
        self._sender = sender
        self._replies = replies
        self._patience = patience
        self._counters = counters
        self._queue = queue
        self._answered_taken = 0  # events of Answered items written into the transport
        # (the transport's byte count where each of those messages ends, its events)
        self._answered: collections.deque = collections.deque()

    async def run(self):
        """Say "OK", then send and answer line by line until END, then until
        the queue (replays) is empty and no replay is due or can become due
        (see ReplayWindow.replays_awaited)."""
        await self._replies.reply(True)
        sender, ended = self._sender, False
        while True:
            parcel = self._queued_or_end() if ended else await sender.next_parcel()
            if parcel is END:
                await sender.flush()
                ended = True
                if await sender.window.replays_awaited():
                    continue
                return
            if type(parcel) is Answered:
                await self._write_answered(parcel)
            elif type(parcel) is Admission:
                await self._admit(parcel)
            elif parcel.replayed:
                self._spill_whole(parcel, replayed=True)
            else:
                await self._send_confirmed(parcel)

    def _queued_or_end(self):
        """After END: what is in the queue (replays), or END once it is empty."""
        try:
            return self._queue.get_nowait()
        except asyncio.QueueEmpty:
            return END

    async def _send_confirmed(self, parcel: Parcel):
        """Hand over each message, waiting at most the timeout for ZeroMQ to
        accept it, and answer each line as soon as it is decided.

        A message that timed out stays in the transport (so it may still go out,
        and its retry by rsyslog make a duplicate); while it is there, new
        messages are refused without being kept, so memory stays bounded."""
        line_ok = True
        for message, nevents, ends in zip(parcel.messages, parcel.events, parcel.ends_line):
            line_ok = line_ok and await self._hand_over(message, nevents, ends)
            if ends:
                if not line_ok:
                    self._counters.events_refused += 1
                await self._replies.reply(line_ok)
                line_ok = True

    async def _hand_over(self, message: bytes, nevents: int, ends: bool) -> bool:
        """Hand message to ZeroMQ: True once it is accepted within patience();
        False when it is not.  It is kept in the replay window as soon as
        ZeroMQ or the transport has it, before anything else runs: a receiver
        may go away the moment after the transport hands it over, before
        this coroutine resumes."""
        sender = self._sender
        patience = self._patience()
        if sender.buffered_bytes() and not patience:
            return False
        if not await self._flushed_within(patience):
            return False
        handed = sender.send_now([message], [nevents], 0)
        if not handed:
            sender.hear_io_thread()
            handed = sender.send_now([message], [nevents], 0)
        if handed:
            sender.window.add(parcel_of([message], [nevents], [ends]))
            return True
        sender.window.pressed()
        patience = self._patience()
        if not patience:
            return False
        sender.spill([message], [nevents], 0)
        sender.window.add(parcel_of([message], [nevents], [ends]))
        return await self._flushed_within(patience)

    def _spill_whole(self, parcel: Parcel, replayed: bool = False):
        """Write a Parcel (replayed, or of lines answered already) into the
        transport at once, without waiting (rsyslog's lines must get replies
        meanwhile), and keep it in the replay window.  aiozmq sends it as
        ZeroMQ takes it; until then new lines wait the timeout and are
        refused, as after any timeout, so memory stays bounded."""
        self._sender.spill(parcel.messages, parcel.events, 0, replayed=replayed, whole=True)
        self._sender.settle()
        self._sender.window.add(parcel)

    async def admits(self) -> bool:
        """Whether the Ledger may take lines now (see Ledger):
        at once True if the transport and the queue are empty, otherwise asked
        through the queue, after what is queued (see _admit)."""
        if not self._sender.buffered_bytes() and self._queue.empty():
            return True
        verdict = asyncio.get_running_loop().create_future()
        await self._queue.put(Admission(verdict))
        return await verdict

    async def _admit(self, admission: Admission):
        """True once the transport is empty, waiting for it as a line waits for
        ZeroMQ (see _hand_over): at most patience(), else False."""
        sender = self._sender
        admitted = not sender.buffered_bytes()
        if not admitted:
            patience = self._patience()
            admitted = bool(patience) and await self._flushed_within(patience)
        if not admission.verdict.done():
            admission.verdict.set_result(admitted)

    async def _write_answered(self, item: Answered):
        """Write item's events (their lines were answered, or are answered now)
        into the transport whole, never refused (see _spill_whole); then
        answer item's lines: "OK", or refused (lines the Ledger did not take)."""
        parcel = item.parcel
        if parcel is not None:
            mark = self._sender.written_bytes()
            for message, events in zip(parcel.messages, parcel.events):
                mark += len(message)
                self._answered.append((mark, events))
            self._answered_taken += sum(parcel.events)
            self._spill_whole(parcel)
            self.answered_handed()
        if item.answers:
            await self._replies.reply(True, item.answers)
        if item.refused:
            self._counters.events_refused += item.refused
            await self._replies.reply(False, item.refused)

    def answered_handed(self) -> int:
        """Events of Answered items that left the transport for ZeroMQ."""
        sent, answered = self._sender.sent_bytes(), self._answered
        while answered and answered[0][0] <= sent:
            answered.popleft()
        return self._answered_taken - sum(events for _, events in answered)

    async def _flushed_within(self, timeout: float) -> bool:
        """True if the transport buffer is (or becomes, within timeout)
        empty.  An empty buffer is never waited for, so timeout 0 accepts what
        ZeroMQ took at once.  (Not asyncio.wait_for: before CPython 3.12 it
        returns the result, swallowing a cancellation, when the flush ends as
        the run's end cancels this task; the task then waited for stdout for
        good.)"""
        sender = self._sender
        if not sender.buffered_bytes():
            sender.settle()
            return True
        flush = asyncio.ensure_future(sender.flush())
        try:
            await asyncio.wait({flush}, timeout=timeout)
        finally:
            if not flush.done():
                flush.cancel()
                await asyncio.wait({flush})
        if flush.cancelled():
            sender.settle()
            return False
        flush.result()
        return True


class StdoutClosed(Exception):
    """--stdout: the reader of stdout has gone (EPIPE) after `written` bytes
    of the data being written went out."""

    def __init__(self, written: int):
        super().__init__("stdout was closed by its reader")
        self.written = written


class StdoutWriter:
    """--stdout: the sender's stand-in, with no ZeroMQ.  Takes Parcels from
    the queue and writes their messages to descriptor 1, one a line, in order;
    an event counts as handed once its line is written.

    Each Parcel is written whole by a daemon thread while the loop waits for
    it: stdout may be a pipe, a terminal or a file, none of which is set
    non-blocking (the descriptor is shared), and a blocked write must not
    hold up the loop (signals, timers) nor the exit once --linger ran out.
    One Parcel is written at a time, so a slow reader of stdout holds the
    queue full and backpressure reaches the input as with a slow receiver.
    A reader gone (EPIPE) ends run() with StdoutClosed: what was not
    written is not handed."""

    def __init__(self, queue: ByteQueue, counters: Counters, fd: int = 1):
        self._queue = queue
        self._counters = counters
        self._fd = fd
        self._writing = 0  # bytes being written now
        self.window = ReplayWindow(0, queue, lambda: 0, lambda: None)  # holds nothing

    async def run(self) -> int:
        """Write Parcels until END; returns 0 (the queue is never rewound).
        StdoutClosed if the reader of stdout has gone."""
        while True:
            parcel = await self._queue.get()
            if parcel is END:
                return 0
            data = b"\n".join(parcel.messages) + b"\n"
            self._writing = len(data)
            try:
                await self._written(data)
            except StdoutClosed as exc:
                self._count_written(parcel, exc.written)
                raise
            finally:
                self._writing = 0
            self._counters.events_handed += sum(parcel.events)

    def _count_written(self, parcel: Parcel, written: int):
        """Count as handed the events of parcel's messages whose whole line
        was among the first `written` bytes."""
        end = 0
        for message, events in zip(parcel.messages, parcel.events):
            end += len(message) + 1
            if end > written:
                return
            self._counters.events_handed += events

    async def _written(self, data: bytes):
        """Write all of data in a thread; StdoutClosed on EPIPE, OSError on other failures."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        threading.Thread(target=self._write_and_wake, args=(data, loop, done),
                         name="zmqpush-stdout", daemon=True).start()
        await done

    def _write_and_wake(self, data: bytes, loop, done):
        failure = None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(self._fd, view):]
        except BrokenPipeError:
            failure = StdoutClosed(len(data) - len(view))
        except OSError as exc:
            failure = exc
        try:
            loop.call_soon_threadsafe(_settle, done, failure)
        except RuntimeError:  # the loop is closed: nobody waits any more
            pass

    def buffered_bytes(self) -> int:
        """Bytes being written to stdout now."""
        return self._writing


def _settle(future: asyncio.Future, failure: BaseException | None):
    """Give future its outcome unless it was cancelled meanwhile."""
    if not future.done():
        if failure is None:
            future.set_result(None)
        else:
            future.set_exception(failure)


# -------------------------------------------------------------- reporting --
# Owns what zmqpush says about itself while it runs: stderr (--stats, SIGUSR1,
# --progress, connection events), systemd notify and watchdog, metrics (file and
# --metrics-listen, /healthz).

# The connection events that tell an endpoint's state (see Reporter.say).
CONNECTION_STATES = ("receiver connected", "receiver disconnected")


class Reporter:
    """Everything zmqpush says about itself while it runs, on stderr: --stats
    lines, SIGUSR1, the --progress line, and connection events (rate-limited).
    Its timers exist only when --stats or --progress asked for them."""

    EVENT_REPEAT_SECONDS = 5.0

    def __init__(self, config: Config, counters: Counters, queue: ByteQueue, sender: Sender,
                 spool: Spool | None = None):
        self._config = config
        self._counters = counters
        self._queue = queue
        self._sender = sender
        self._spool = spool
        self._last = (time.monotonic(), 0)
        self._timers: list = []
        self._progress = config.progress and os.isatty(2)
        self._event_last: dict = {}
        self._state: dict = {}  # endpoint -> its connection state now (see say)
        self._state_said: dict = {}  # endpoint -> the state said last
        self._settling: dict = {}  # endpoint -> TimerHandle of _say_settled

    def snapshot(self) -> dict:
        """The counters now, with the send rate since the previous snapshot."""
        values = self._counter_values()
        now, sent_before = time.monotonic(), self._last[1]
        rate = (values["sent"] - sent_before) / max(1e-9, now - self._last[0])
        self._last = (now, values["sent"])
        values["rate"] = round(rate, 1)
        if self._spool is not None:
            values.update(self._spool_values())
        return values

    def figures(self) -> dict:
        """The counters now, as snapshot() without the rate (so it changes nothing)."""
        values = self._counter_values()
        if self._spool is not None:
            values.update(self._spool_values())
        return values

    def _counter_values(self) -> dict:
        c = self._counters
        return {"read": c.events_read, "bytes": c.bytes_read, "sent": c.events_handed,
                "queued": self._queue.events(), "dropped": c.events_dropped,
                "split": c.pieces, "transport_bytes": self._sender.buffered_bytes(),
                "drain_waits": c.drain_waits, "connected": c.connected,
                "disconnects": c.disconnects, "replayed": c.events_replayed,
                "window_bytes": self._sender.window.nbytes,
                "handshake_failures": c.handshake_failures, "refused": c.refused,
                **({"joined": c.events_joined, "joined_lines": c.lines_joined,
                    "cut": c.events_cut, "pushed_out": c.events_pushed_out}
                   if self._config.multiline is not None else {}),
                **({"json_errors": c.json_failures, "json_fixed": c.json_fixed}
                   if self._config.structured or self._config.container else {})}

    def _spool_values(self) -> dict:
        """The spool's figures: bytes and segments on disk, bytes not yet sent
        (nor in memory), the oldest unsent record's age in seconds, damaged
        stretches skipped, and lines found from a previous run."""
        spool, queue = self._spool, self._queue
        return {"spool_bytes": spool.nbytes, "spool_segments": spool.segments,
                "spool_unsent_bytes": queue.unsent_bytes(),
                "spool_age": round(spool.age(queue.oldest_unsent()), 1),
                "spool_corrupt": self._counters.spool_corrupt,
                "spool_found": self._counters.events_found,
                "spool_memory_only": self._counters.events_memory_only}

    def print_stats(self):
        """One counters line: "zmqpush: read=N ..." or, with --stats-format json, an object."""
        values = self.snapshot()
        if self._config.stats_format == "json":
            write_stderr(json.dumps(values, separators=(",", ":")) + "\n")
        else:
            warn(" ".join(f"{k}={v}" for k, v in values.items()))

    def start(self):
        """Start the timers that were asked for."""
        loop = asyncio.get_running_loop()
        if self._config.stats:
            self._every(loop, self._config.stats, self.print_stats)
        if self._progress:
            self._every(loop, 0.5, self._print_progress)

    def _every(self, loop, seconds: float, action):
        def tick():
            action()
            self._timers[index] = loop.call_later(seconds, tick)
        index = len(self._timers)
        self._timers.append(loop.call_later(seconds, tick))

    def stop(self):
        """Cancel the timers."""
        for timer in [*self._timers, *self._settling.values()]:
            timer.cancel()
        if self._progress:
            self._print_progress()
            write_stderr("\n")

    def _print_progress(self):
        v = self.snapshot()
        state = f"{v['connected']} connected" if v["connected"] else "waiting for a receiver"
        spooled = ""
        if self._spool is not None:
            spooled = (f"{v['spool_unsent_bytes'] / (1 << 20):,.1f} MiB spooled "
                       f"({v['spool_age']:g} s old"
                       + (f", {v['spool_corrupt']} damaged), " if v["spool_corrupt"] else "), "))
        write_stderr(f"\r\x1b[Kzmqpush: {v['rate']:,.0f} lines/s, {v['sent']:,} sent, "
                     f"{v['queued']:,} queued, {spooled}{v['dropped']:,} dropped, "
                     f"{v['replayed']:,} replayed, {state}")

    def say(self, what: str, endpoint: str):
        """One line per event, at most one per kind and endpoint every 5 s.
        A connection state (CONNECTION_STATES) held back by that limit is
        said once the spell is over (see _say_settled), if it is not the one
        said last: the last line about an endpoint tells its state."""
        if self._config.quiet:
            return
        now = time.monotonic()
        if what in CONNECTION_STATES:
            self._state[endpoint] = what
        last, skipped = self._event_last.get((what, endpoint), (-1e9, 0))
        if now - last < self.EVENT_REPEAT_SECONDS:
            self._event_last[(what, endpoint)] = (last, skipped + 1)
            if what in CONNECTION_STATES and endpoint not in self._settling:
                self._settling[endpoint] = asyncio.get_running_loop().call_later(
                    last + self.EVENT_REPEAT_SECONDS - now, self._say_settled, endpoint)
            return
        more = f" ({skipped} more since last said)" if skipped else ""
        self._event_last[(what, endpoint)] = (now, 0)
        if what in CONNECTION_STATES:
            self._state_said[endpoint] = what
        warn(f"{what} {endpoint}{more}")

    def _say_settled(self, endpoint: str):
        """The end of a spell whose connection messages were held back: say
        the endpoint's state now once, unless it was the last said; if more
        changes came meanwhile, look again at the end of the next spell."""
        del self._settling[endpoint]
        state = self._state[endpoint]
        if state == self._state_said.get(endpoint):
            return
        now = time.monotonic()
        last, skipped = self._event_last.get((state, endpoint), (-1e9, 0))
        if now - last < self.EVENT_REPEAT_SECONDS:
            self._settling[endpoint] = asyncio.get_running_loop().call_later(
                last + self.EVENT_REPEAT_SECONDS - now, self._say_settled, endpoint)
            return
        self._event_last[(state, endpoint)] = (now, 0)
        self._state_said[endpoint] = state
        more = f", {skipped} such messages held back" if skipped else ""
        warn(f"{state} {endpoint} (the state now{more})")


class Notifier:
    """systemd's notify protocol (sd_notify(3)) with the standard library: one
    datagram a message to the AF_UNIX socket that NOTIFY_SOCKET names (a path,
    or an abstract name written with a leading "@").  A message that cannot be
    sent is lost, never a failure of the run: the first such loss is said once
    on stderr."""

    def __init__(self, address: str):
        self._shown = address
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self._failed = False

    @classmethod
    def from_environment(cls, environ, pid: int) -> Notifier | None:
        """A Notifier for NOTIFY_SOCKET, or None if it is unset or empty, not a
        path or @name (said once), or not meant for zmqpush: SYSTEMD_EXEC_PID,
        which systemd sets to the pid of the process it started, names another
        process.  That process inherited NOTIFY_SOCKET and passed it on, as
        rsyslogd does to its omprog programs: the unit's messages are its own."""
        address = environ.get("NOTIFY_SOCKET", "")
        started = environ.get("SYSTEMD_EXEC_PID")
        if not address or (started is not None and started.strip() != str(pid)):
            return None
        if not address.startswith(("/", "@")) or len(address) < 2:
            warn(f"NOTIFY_SOCKET={address!r} is neither an AF_UNIX socket path nor "
                 "@name: systemd is not notified")
            return None
        return cls(address)

    def send(self, message: str):
        """Send one message (lines of NAME=VALUE); a failure is said the first time only."""
        try:
            self._socket.sendto(message.encode("utf-8", "replace"), self._address)
        except OSError as exc:
            if not self._failed:
                self._failed = True
                warn(f"cannot notify systemd at NOTIFY_SOCKET={self._shown}: "
                     f"{exc.strerror or exc} (the run goes on; said once)")

    def close(self):
        self._socket.close()


def watchdog_interval(environ, pid: int) -> float | None:
    """Seconds between WATCHDOG=1 pings: half of WATCHDOG_USEC, if it is a
    positive integer and WATCHDOG_PID, if set, is pid (as sd_watchdog_enabled(3)
    decides); else None (no pings)."""
    text = environ.get("WATCHDOG_USEC", "")
    if not (text.isascii() and text.isdigit() and len(text) <= 19):
        return None
    owner = environ.get("WATCHDOG_PID")
    if int(text) <= 0 or (owner is not None and owner.strip() != str(pid)):
        return None
    return max(MIN_WATCHDOG_SECONDS, int(text) / 2e6)


# The metrics --metrics-file writes: (name, type, help, key of Reporter.figures()).
METRICS = (
    ("zmqpush_events_read_total", "counter",
     "Events made of what was read, after joining: a line, a piece of a line past "
     "--max-line-bytes, or a joined multi-line event (--multiline) each count 1, as does "
     "an event a previous run left in the spool; not bytes nor lines read.", "read"),
    ("zmqpush_read_bytes_total", "counter", "Bytes read on stdin.", "bytes"),
    ("zmqpush_events_sent_total", "counter",
     "Events handed to ZeroMQ (--stdout: written), each line of a --batch array one, "
     "replays not included.", "sent"),
    ("zmqpush_events_dropped_total", "counter",
     "Events dropped while the queue or spool was full (--when-full drop).", "dropped"),
    ("zmqpush_split_pieces_total", "counter",
     'Messages marked "@continues":true, pieces of lines past --max-line-bytes (each '
     "piece but a line's last).", "split"),
    ("zmqpush_events_replayed_total", "counter",
     "Events handed to ZeroMQ again from the replay window after a receiver went away "
     "(also counted in events_sent the first time).", "replayed"),
    ("zmqpush_confirm_refused_lines_total", "counter",
     "--confirm: lines answered with a refusal (rsyslog sends them again).", "refused_lines"),
    ("zmqpush_drain_waits_total", "counter",
     "Times the sender waited for ZeroMQ to take messages it had refused (backpressure).",
     "drain_waits"),
    ("zmqpush_receiver_disconnects_total", "counter",
     "Times a connected receiver went away.", "disconnects"),
    ("zmqpush_handshake_failures_total", "counter",
     "Failed ZeroMQ handshakes (ours, and with --bind the peers').", "handshake_failures"),
    ("zmqpush_peers_refused_total", "counter",
     "Connection attempts the --bind allowlists refused.", "refused"),
    ("zmqpush_receivers_connected", "gauge", "Receivers connected now.", "connected"),
    ("zmqpush_queued_events", "gauge",
     "Events encoded and waiting in the queue between reader and sender (with a spool: "
     "in memory).", "queued"),
    ("zmqpush_transport_buffered_bytes", "gauge",
     "Bytes in the aiozmq transport buffer.", "transport_bytes"),
    ("zmqpush_replay_window_bytes", "gauge", "Bytes the replay window holds.", "window_bytes"),
)
MULTILINE_METRICS = (
    ("zmqpush_multiline_events_total", "counter",
     "Events joined of two lines or more (--multiline); each counts 1 in events_read.",
     "joined"),
    ("zmqpush_multiline_lines_total", "counter",
     "Lines read that went into those joined events.", "joined_lines"),
    ("zmqpush_multiline_cut_events_total", "counter",
     "Multi-line events cut at a cap in lines or bytes.", "cut"),
    ("zmqpush_multiline_pushed_out_events_total", "counter",
     "Events sent unfinished past the per-source caps (marked @continues).", "pushed_out"),
)
STRUCTURED_METRICS = (
    ("zmqpush_json_errors_total", "counter",
     "Lines --json or --journal sent as text, not being JSON objects.", "json_errors"),
    ("zmqpush_json_fixed_total", "counter",
     "Events with a reserved field moved or noted (--json, --journal).", "json_fixed"),
)
SPOOL_METRICS = (
    ("zmqpush_spool_bytes", "gauge", "Bytes of the spool's segments on disk.", "spool_bytes"),
    ("zmqpush_spool_segments", "gauge", "Segment files of the spool.", "spool_segments"),
    ("zmqpush_spool_unsent_bytes", "gauge",
     "Spooled bytes not yet sent (nor held in memory).", "spool_unsent_bytes"),
    ("zmqpush_spool_oldest_unsent_age_seconds", "gauge",
     "Age of the oldest unsent record in the spool.", "spool_age"),
    ("zmqpush_spool_damaged_stretches_total", "counter",
     "Damaged stretches of the spool skipped.", "spool_corrupt"),
    ("zmqpush_spool_found_events_total", "counter",
     "Events read from what a previous run left in the spool.", "spool_found"),
    ("zmqpush_spool_memory_only_events_total", "counter",
     "Events kept in memory only because the spool could not take them.",
     "spool_memory_only"),
)
def _label_value(text: str) -> str:
    """text escaped for a label value of the text exposition format."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Exposition:
    """The counters in Prometheus' text exposition format (0.0.4), every sample
    with the labels given (logtype, the instance's name, the pid) whose value
    is not empty."""

    def __init__(self, labels: dict, started: float):
        pairs = [f'{key}="{_label_value(value)}"' for key, value in labels.items() if value]
        self._labels = "{" + ",".join(pairs) + "}" if pairs else ""
        self._started = started

    def text(self, figures: dict, now: float, exit_code: int | None = None) -> str:
        """# HELP, # TYPE and one sample for each metric; exit_code's only if given."""
        labels = self._labels
        metrics = (METRICS + (SPOOL_METRICS if "spool_bytes" in figures else ())
                   + (MULTILINE_METRICS if "joined" in figures else ())
                   + (STRUCTURED_METRICS if "json_errors" in figures else ()))
        values = [(name, kind, text, figures[key]) for name, kind, text, key in metrics]
        values += [
            ("zmqpush_start_time_seconds", "gauge",
             "When this run started, in seconds since the epoch.", round(self._started, 3)),
            ("zmqpush_last_update_timestamp_seconds", "gauge",
             "When this file was written, in seconds since the epoch.", round(now, 3))]
        if exit_code is not None:
            values.append(("zmqpush_exit_code", "gauge",
                           "The exit code of the run that wrote this file last (not 0).",
                           exit_code))
        return "".join(f"# HELP {name} {text}\n# TYPE {name} {kind}\n{name}{labels} {value}\n"
                       for name, kind, text, value in values)


class MetricsFile:
    """--metrics-file, for node_exporter's textfile collector: each version of
    the exposition written whole to a hidden temporary file beside PATH and
    renamed over it, so a reader finds the previous version or the new one,
    never a part.  A write or removal that fails is said once on stderr; the
    run goes on."""

    def __init__(self, path: str, exposition: Exposition):
        self.path = path
        directory = os.path.dirname(path)
        self._temporary = os.path.join(directory, f".zmqpush-metrics.{os.getpid()}.tmp")
        self._exposition = exposition
        self._failed = False
        self._written = None  # (st_dev, st_ino) of the file this run put at path

    def write(self, figures: dict, exit_code: int | None = None):
        """Replace the file by one with figures, the start time and now (and
        exit_code, when the run ended with one that is not 0)."""
        try:
            if not self._ours_or_none():
                raise OSError(errno.EEXIST, "something else is there now")
            with open(self._temporary, "w", encoding="utf-8") as f:
                f.write(self._exposition.text(figures, time.time(), exit_code))
                written = os.fstat(f.fileno())
            os.replace(self._temporary, self.path)
            self._written = (written.st_dev, written.st_ino)
        except OSError as exc:
            self._say(f"cannot write --metrics-file {self.path}", exc)
            self._discard(self._temporary)

    def remove(self):
        """Remove the file (a run that ended cleanly leaves none), if it is
        still the one this run wrote."""
        if self._written is not None and self._ours_or_none():
            self._discard(self.path)

    def _ours_or_none(self) -> bool:
        """Whether path holds nothing, or the regular file this run wrote last
        (a previous run's file is replaced too, if it is a regular file)."""
        try:
            st = os.lstat(self.path)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if self._written is None:
            return stat.S_ISREG(st.st_mode)
        return (st.st_dev, st.st_ino) == self._written

    def _discard(self, path: str):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            self._say(f"cannot remove {path}", exc)

    def _say(self, what: str, exc: OSError):
        if not self._failed:
            self._failed = True
            warn(f"{what}: {exc.strerror or exc} (the run goes on; said once)")


class Publisher:
    """What systemd and Prometheus see of the run (README "Running as a service"):
    with a Notifier, READY=1 at start, STATUS= with the main counters, STOPPING=1
    when input ends, and WATCHDOG=1 every watchdog seconds; with a MetricsFile,
    the counters in it, and at the end the file removed (exit 0) or its last
    version with the exit code.

    No timer runs while the run is idle.  The counters are published at most
    every PUBLISH_SECONDS while they change, or while lines wait for a receiver
    that is connected; once a look finds neither, the publisher sleeps until
    stdin gets something (an edge-triggered epoll of its own on stdin, which
    the loop watches only while it sleeps) or a receiver connects or goes away
    (wake()).  The
    watchdog pings come from a loop timer, so they stop when the loop stops
    turning.  Nothing of this touches the reader's or the sender's paths."""

    def __init__(self, reporter: Reporter, counters: Counters, *, notifier: Notifier | None,
                 metrics: MetricsFile | None, stdin_fd: int, watchdog: float | None,
                 listening: socket.socket | None = None,
                 exposition: Exposition | None = None):
        self._reporter = reporter
        self._listening = listening
        self._exposition = exposition
        self._server: asyncio.AbstractServer | None = None
        self._progress = (-1, 0.0)  # events sent when last seen moving, and when
        self._counters = counters
        self._notifier = notifier
        self._metrics = metrics
        self._stdin_fd = stdin_fd
        self._watchdog = watchdog if notifier is not None else None
        self._loop = asyncio.get_running_loop()
        self._published: dict | None = None
        self._published_at = -1e9
        self._unchanged_looks = 0  # looks in a row that found nothing new
        self._was_waiting = False  # events waited at the last look or request
        self._timer: asyncio.TimerHandle | None = None
        self._ping: asyncio.TimerHandle | None = None
        self._epoll = None
        self._asleep = False
        self._input_over = False

    async def start(self):
        """Serve --metrics-listen, publish the counters, say READY=1, start the
        watchdog pings."""
        if self._listening is not None:
            self._server = await asyncio.start_server(self._on_request, sock=self._listening)
        self._epoll = self._watch_stdin()
        figures = self._figures()
        self._publish(figures, "READY=1\n")
        if self._watchdog is not None:
            self._on_watchdog()
        self._schedule()

    def wake(self):
        """Something changed that stdin did not bring (a connection event):
        publish soon (if asleep, or looks had spaced out)."""
        self._unchanged_looks = 0
        if self._asleep:
            self._end_sleep()
            self._schedule()
        elif self._timer is not None:
            self._timer.cancel()
            self._schedule()

    def stopping(self, waiting: int, linger: float):
        """Input ended: STOPPING=1, with how many events are still to be handed
        over; stdin is watched no more (what it still holds is never read)."""
        self._input_over = True
        self._unwatch_stdin()
        if self._notifier is not None:
            self._notifier.send(f"STOPPING=1\nSTATUS=stopping: {waiting} events not yet "
                                f"handed to ZeroMQ, lingering up to {linger:g} s")

    def close(self, exit_code: int):
        """The run is over: stop the timers and the watch; remove the metrics
        file after exit 0, else write its last version with exit_code."""
        for timer in (self._timer, self._ping):
            if timer is not None:
                timer.cancel()
        self._timer = self._ping = None
        self._unwatch_stdin()
        if self._server is not None:
            self._server.close()
        if self._metrics is not None:
            if exit_code == EXIT_OK:
                self._metrics.remove()
            else:
                self._metrics.write(self._figures(), exit_code)
        if self._notifier is not None:
            self._notifier.close()

    def _figures(self) -> dict:
        figures = self._reporter.figures()
        figures["refused_lines"] = self._counters.events_refused
        return figures

    def _publish(self, figures: dict, first: str = ""):
        self._published, self._published_at = figures, time.monotonic()
        if self._metrics is not None:
            self._metrics.write(figures)
        if self._notifier is not None:
            self._notifier.send(first + "STATUS=" + self._status(figures))

    @staticmethod
    def _status(v: dict) -> str:
        """One line for systemctl status: what was read, sent, queued, dropped, to whom."""
        text = (f"{v['read']} read, {v['sent']} sent, {v['queued']} queued, "
                f"{v['dropped']} dropped, {v['connected']} receivers connected")
        if "spool_unsent_bytes" in v:
            text += f", {v['spool_unsent_bytes']} bytes spooled unsent"
        return text

    def _schedule(self):
        """Look again PUBLISH_SECONDS after the last publication, and at least
        PUBLISH_FIRST_SECONDS from now; after looks that found nothing new,
        twice as long each time, up to PUBLISH_MOST_SECONDS."""
        delay = max(PUBLISH_FIRST_SECONDS,
                    self._published_at + PUBLISH_SECONDS - time.monotonic(),
                    min(PUBLISH_MOST_SECONDS, PUBLISH_SECONDS * 2 ** self._unchanged_looks
                        if self._unchanged_looks else 0.0))
        self._timer = self._loop.call_later(delay, self._look)

    def _look(self):
        """Publish if the counters changed; look again while they change or
        something waits to be sent; else sleep until stdin gets something."""
        self._timer = None
        figures = self._figures()
        self.stalled_seconds(figures)
        if self._changed(figures):
            self._unchanged_looks = 0
            self._publish(figures)
            self._schedule()
            return
        self._unchanged_looks = min(self._unchanged_looks + 1, 16)
        if self._busy(figures):
            self._schedule()
        elif self._epoll is not None:
            self._sleep()
        elif not self._input_over:  # stdin cannot be polled (a regular file): read at once
            self._schedule()

    def _changed(self, figures: dict) -> bool:
        """Whether figures differ from those published, an age that only grows
        (the spool's oldest unsent record) aside."""
        published = self._published
        if published is None:
            return True
        return any(value != published.get(key) for key, value in figures.items()
                   if key != "spool_age")

    def _busy(self, figures: dict) -> bool:
        """A receiver is connected and lines wait: it may take them any moment
        (with none connected, the next connection event wakes the publisher)."""
        return bool(self._counters.connected) and bool(
            self._counters.not_handed() > 0 or figures["queued"]
            or figures["transport_bytes"] or figures.get("spool_unsent_bytes"))

    def _watch_stdin(self):
        """An edge-triggered epoll of stdin for readability, or None if stdin
        cannot be polled."""
        epoll = select.epoll()
        try:
            epoll.register(self._stdin_fd, select.EPOLLIN | select.EPOLLET)
        except OSError:
            epoll.close()
            return None
        return epoll

    def _unwatch_stdin(self):
        if self._asleep:
            self._end_sleep()
        if self._epoll is not None:
            self._epoll.close()
            self._epoll = None

    def _sleep(self):
        """Let the loop watch stdin: the next bytes (or bytes there already) wake us."""
        self._epoll.poll(0)  # an edge taken while awake is no news
        self._epoll.modify(self._stdin_fd, select.EPOLLIN | select.EPOLLET)  # rearms if ready
        self._loop.add_reader(self._epoll.fileno(), self._on_stdin)
        self._asleep = True

    def _end_sleep(self):
        self._loop.remove_reader(self._epoll.fileno())
        self._asleep = False

    def _on_stdin(self):
        self._epoll.poll(0)
        self._end_sleep()
        self._unchanged_looks = 0
        self._schedule()

    def stalled_seconds(self, figures: dict) -> float:
        """How long events have waited with none sent, as far as the looks and
        requests so far saw (0 while nothing waits or events go out)."""
        now = time.monotonic()
        waiting = bool(self._counters.not_handed() > 0 or figures["queued"]
                       or figures["transport_bytes"] or figures.get("spool_unsent_bytes"))
        was_waiting, self._was_waiting = self._was_waiting, waiting
        if not waiting or not was_waiting or figures["sent"] != self._progress[0]:
            self._progress = (figures["sent"], now)  # a wait seen first counts from now
            return 0.0
        return now - self._progress[1]

    async def _on_request(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        """One HTTP/1.0-style exchange: GET /metrics, GET /healthz[?stall=SECONDS]."""
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HTTP_TIMEOUT)
            status, body, kind = self._answer(request.split(b"\r\n", 1)[0])
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\n"
                         f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
                         .encode() + body)
            await asyncio.wait_for(writer.drain(), HTTP_TIMEOUT)
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError,
                OSError):
            pass
        finally:
            writer.close()

    def _answer(self, line: bytes) -> tuple:
        """(status, body, content type) for a request line."""
        parts = line.decode("latin-1").split()
        if len(parts) != 3 or parts[0] != "GET":
            return "405 Method Not Allowed", b"GET only\n", "text/plain"
        path, _, query = parts[1].partition("?")
        figures = self._figures()
        stalled = self.stalled_seconds(figures)
        if path == "/metrics":
            return ("200 OK", self._exposition.text(figures, time.time()).encode(),
                    "text/plain; version=0.0.4; charset=utf-8")
        if path == "/healthz":
            limit = _stall_limit(query)
            if limit is None:
                return "400 Bad Request", b"stall=SECONDS, a number\n", "text/plain"
            if stalled > limit:
                return ("503 Service Unavailable",
                        f"stalled: events wait, none sent for {stalled:.0f} s\n".encode(),
                        "text/plain")
            return "200 OK", b"ok\n", "text/plain"
        return "404 Not Found", b"/metrics or /healthz\n", "text/plain"

    def _on_watchdog(self):
        self._notifier.send("WATCHDOG=1")
        self._ping = self._loop.call_later(self._watchdog, self._on_watchdog)


def _stall_limit(query: str) -> float | None:
    """/healthz's stall=SECONDS (default DEFAULT_STALL_SECONDS), None if malformed."""
    values = [v for k, _, v in (p.partition("=") for p in query.split("&") if p)
              if k == "stall"]
    try:
        limit = float(values[-1]) if values else DEFAULT_STALL_SECONDS
    except ValueError:
        return None
    return limit if limit >= 0 else None


def listen_socket(address: tuple) -> socket.socket:
    """A TCP socket bound to --metrics-listen's (host, port) and listening; OSError if not."""
    host, port = address
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(16)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def service_publisher(config: Config, reporter: Reporter, counters: Counters,
                      stdin_fd: int, environ, *,
                      listening: socket.socket | None = None) -> Publisher | None:
    """A Publisher if systemd (NOTIFY_SOCKET), --metrics-file or --metrics-listen
    (listening: its bound socket) asks for one, else None."""
    pid = os.getpid()
    notifier = Notifier.from_environment(environ, pid)
    labels = {"logtype": config.logtype.decode("utf-8"), "name": config.metrics_name}
    started = time.time()
    metrics = None
    if config.metrics_file:
        pid_label = {"pid": str(pid)} if PID_PLACEHOLDER in config.metrics_file else {}
        metrics = MetricsFile(metrics_path(config.metrics_file, pid),
                              Exposition({**labels, **pid_label}, started))
    if notifier is None and metrics is None and listening is None:
        return None
    return Publisher(reporter, counters, notifier=notifier, metrics=metrics,
                     stdin_fd=stdin_fd, watchdog=watchdog_interval(environ, pid),
                     listening=listening, exposition=Exposition(labels, started))


# -------------------------------------------------------------- lifecycle --
# Owns the run: wiring the parts, supervision, signals, the end-of-input linger
# and the exit code.

class Shipper:
    """One run: stdin -> queue -> ZeroMQ, until EOF, a signal or a failure, then
    linger.  Owns the wiring of the parts, supervision, the linger, signals and
    the exit code.

    Supervision happens here alone.  The reader and sender tasks report their
    exceptions to _fail(), and so does every callback the loop runs (socket
    monitor, timers, signal handlers) through the loop's exception handler.
    The first failure ends the run as EOF would: reading stops, what was read
    is still delivered within --linger where the sender can, then one line
    names the cause and the exit code is 1.  Every task is cancelled and
    awaited before the socket closes.
    """

    def __init__(self, config: Config, stdin_fd: int = 0, stdout_closed: bool = False):
        self.config = config
        self.counters = Counters()
        self._stdin_fd = stdin_fd
        self._stdout_closed = stdout_closed
        self._started = time.perf_counter()
        self._stop_signals = 0
        self._deadline = 0.0
        self._lingered = 0.0  # seconds the sending went on after input ended
        self._linger_left = 0.0  # of --linger, what was left for ZeroMQ at the close
        self._cause: str | None = None
        self._failed: asyncio.Future | None = None
        self._tasks: list = []
        self._socket = PushSocket(config)
        self._reader: StdinReader | None = None
        self._pipeline: Pipeline | None = None
        self._sender: Sender | None = None
        self._queue: ByteQueue | None = None
        self._reporter: Reporter | None = None
        self._waiting: asyncio.TimerHandle | None = None
        self._replays_waiting: list = []  # [endpoint, TimerHandle] (see _on_receiver_lost)
        self._replies: Replies | None = None
        self._confirmer: Confirmer | None = None
        self._answered_lost = (0, 0)  # see _answered_unhanded
        self._spool: Spool | None = None
        self._publisher: Publisher | None = None
        self._listening: socket.socket | None = None
        self._stdout_gone = False  # --stdout: its reader went away (see StdoutWriter)

    async def run(self) -> int:
        """Ship stdin; returns the exit code."""
        config = self.config
        if config.metrics_listen is not None:
            try:
                self._listening = listen_socket(config.metrics_listen)
            except OSError as exc:
                warn(f"cannot listen on --metrics-listen {config.metrics_listen[0]}:"
                     f"{config.metrics_listen[1]}: {exc.strerror or exc}")
                return EXIT_ERROR
        if config.spool:
            try:
                self._spool = Spool(config.spool, config.spool_bytes, config.spool_sync,
                                    self.counters)
            except SpoolError as exc:
                warn(str(exc))
                return EXIT_USAGE
        try:
            if not config.stdout:
                await self._socket.open(self.counters, self._on_connection_event,
                                        self._on_receiver_lost)
        except OSError as exc:
            warn(f"cannot use endpoint {' '.join(config.connect + config.bind)}: "
                 f"{exc.strerror or exc}")
            if self._spool is not None:
                self._spool.close(done=False)
            return endpoint_error_code(exc)
        self._wire()
        loop = asyncio.get_running_loop()
        self._failed = loop.create_future()
        loop.set_exception_handler(self._on_loop_exception)
        self._reporter.start()
        if not config.stdout:
            self._waiting = loop.call_later(1.0, self._say_if_unconnected)
            say_unresolved_names(config.connect, loop)
        self._install_signals()
        try:
            await self._ship()
        finally:
            if self._waiting is not None:
                self._waiting.cancel()
            self._replay_waiting_now()
            if self._replies is not None:
                self._replies.close()
            self._reader.close()
            self._socket.stop_watching()
            self._reporter.stop()
        handed = self.counters.events_handed + self.counters.events_replayed
        self._answered_lost = self._answered_unhanded()
        self._linger_left = max(0.0, self._deadline - time.monotonic())
        delivered = config.stdout or await self._socket.close(
            self._linger_left, bool(self._sender.buffered_bytes()), bool(handed))
        if self._spool is not None:
            self._spool.close(done=delivered and self._sent_everything())
        code = self._report(delivered)
        if self._publisher is not None:
            self._publisher.close(code)
        return code

    def _answered_unhanded(self) -> tuple:
        """--confirm --multiline: (events, lines) answered "OK" to rsyslog and
        never handed to ZeroMQ: events of Answered items (no spool), lines
        still held by the Joiner (the run ended while it could not queue them)."""
        events = 0
        if self._confirmer is not None:
            events = self.counters.events_answered - self._confirmer.answered_handed()
        return events, self._pipeline.held_lines()

    def _sent_everything(self) -> bool:
        """The sender finished, and no receiver went away after that (whose
        replay from the spool would then never have been sent)."""
        sender = self._tasks[1]
        return (sender.done() and not sender.cancelled() and sender.exception() is None
                and sender.result() == self._queue.rewinds)

    def _wire(self):
        """The queue, the reader feeding it, and the sender (with its replay
        window) and reporter around it."""
        config = self.config
        spool = self._spool
        self._queue = (ByteQueue(config.queue_bytes) if spool is None
                       else SpoolQueue(config.queue_bytes, spool, self.counters))
        if config.confirm:
            self._replies = Replies(self._stop_reading, None if self._stdout_closed else 1)
        self._pipeline = build_pipeline(config, self._queue, encoder=self._encoder(),
                                        counters=self.counters, replies=self._replies)
        self._reader = StdinReader(
            self._stdin_fd, self._pipeline, counters=self.counters,
            read_bytes=config.batch_bytes if config.batch else DEFAULT_READ_BYTES,
            drop_when_full=config.when_full == "drop", coalesce=config.coalesce)
        if spool is not None:
            # --confirm answers a line once spooled: one kept in memory only
            # would be answered before anything holds it for good.
            self._queue.memory_only = not config.confirm
        if config.stdout:
            self._sender = StdoutWriter(self._queue, self.counters)
        else:
            self._sender = Sender(self._socket.stream, self._queue, self.counters,
                                  self._replay_window(), config)
        self._reporter = Reporter(config, self.counters, self._queue, self._sender, spool)
        self._publisher = service_publisher(config, self._reporter, self.counters,
                                            self._stdin_fd, os.environ,
                                            listening=self._listening)

    def _replay_window(self) -> ReplayWindow:
        """The sender's replay window: in memory, or with a spool on disk."""
        config, spool = self.config, self._spool
        if spool is None:
            return ReplayWindow(config.replay_bytes, self._queue, self._socket.unsent_bytes,
                                self._stop_hearing)
        return SpoolWindow(config.replay_bytes, self._queue, self._socket.unsent_bytes,
                           self._stop_hearing, spool=spool, sndhwm=config.sndhwm)

    def _encoder(self):
        """The plain Encoder, or with --json or --journal the JsonEncoder or
        JournalEncoder (chosen here once: the plain one never tests for them)."""
        config = self.config
        args = (config.logtype, os.getpid(), config.batch, config.fields, config.timestamp)
        kwargs = {"array_bytes": config.array_bytes,
                  "run_id": os.urandom(8).hex() if config.event_ids else None}
        if config.container is not None:  # Unwrapping made the objects: see there
            return JsonEncoder(*args, counters=self.counters, overwrite=config.json_overwrite,
                               checked=CONTAINER_CHECKED_KEYS, **kwargs)
        if config.structured is None:
            return Encoder(*args, **kwargs)
        if config.structured == "journal":
            ecs = any(isinstance(value, dict) for key, value in config.fields if key == b"host")
            return JournalEncoder(*args, counters=self.counters, ecs=ecs, **kwargs)
        return JsonEncoder(*args, counters=self.counters, target=config.json_target,
                           message_key=config.json_message_key,
                           overwrite=config.json_overwrite, **kwargs)

    def _stop_reading(self):
        self._reader.stop()

    def _on_connection_event(self, what: str, endpoint: str):
        if what == "connected" and self._waiting is not None:
            self._waiting.cancel()  # a timer left in the loop would still wake it
        if self._reporter is not None:
            self._reporter.say(f"receiver {what}", endpoint)
        if self._publisher is not None:
            self._publisher.wake()

    def _on_receiver_lost(self, endpoint: str, takes_messages):
        """Replay what may have been in flight to the receiver that went away,
        once its socket no longer takes messages (takes_messages(), which
        makes the socket read its commands, says False), looking REPLAY_LOOK
        apart, at most REPLAY_WAIT_MOST (a --bind socket with other receivers
        goes on taking them).  ZeroMQ's I/O thread reports a disconnect just
        before it drops the connection's queue, and the socket learns of the
        drop only when it next reads its commands: a message handed before
        that goes into a queue that is dropped, and must be in the replay."""
        if self._sender is None:
            return
        deadline = asyncio.get_running_loop().time() + REPLAY_WAIT_MOST
        self._sender.window.replay_due()
        self._replay_once_dropped([endpoint, None], takes_messages, deadline)

    def _replay_once_dropped(self, waiting: list, takes_messages, deadline: float):
        """Replay for waiting ([endpoint, timer]) now if the socket takes no
        more messages or the deadline passed, else look again REPLAY_LOOK later."""
        loop = asyncio.get_running_loop()
        if takes_messages() and loop.time() < deadline:
            if waiting[1] is None:
                self._replays_waiting.append(waiting)
            waiting[1] = loop.call_later(REPLAY_LOOK, self._replay_once_dropped,
                                         waiting, takes_messages, deadline)
            return
        if waiting[1] is not None:
            self._replays_waiting.remove(waiting)
        self._replay(waiting[0])
        self._sender.window.replay_done()

    def _stop_hearing(self):
        """The sender has sent everything after input ended (see
        ReplayWindow.replays_awaited): handle the connection events ready now,
        and if no receiver went away among them stop the monitors at once,
        hearing nothing more: a receiver heard going away once the sender has
        ended would have a replay that nothing sends.  One that did go away
        leaves them on: its replay is sent first, and the sender comes back."""
        disconnects = self.counters.disconnects
        self._socket.hear()
        if self.counters.disconnects == disconnects:
            self._socket.stop_watching(hear_left=False)

    def _replay_waiting_now(self):
        """The run ends: replays still waiting are done now (what they put
        back is counted, and said to be lost if nothing sends it)."""
        for endpoint, timer in self._replays_waiting:
            timer.cancel()
            self._replay(endpoint)
            self._sender.window.replay_done()
        self._replays_waiting.clear()

    def _replay(self, endpoint: str):
        """Put the replay window back in the queue (see ReplayWindow.replay)."""
        events = self._sender.window.replay(self._sender.take_handed_part())
        if self._spool is None:
            self.counters.events_requeued += events
        if events:
            self._reporter.say(f"replaying {events} events that may have been in flight to",
                               endpoint)

    def _confirm_patience(self) -> float:
        """Seconds a line may wait for ZeroMQ in confirm mode now: --confirm-timeout
        while a receiver is connected; before the first one, at most what is left of
        the first second (then "no receiver yet" is said); none after that."""
        if self.counters.connected:
            return self.config.confirm_timeout
        if self.counters.disconnects or self._waiting.cancelled():
            return 0.0
        left = self._waiting.when() - asyncio.get_running_loop().time()
        return min(self.config.confirm_timeout, max(0.0, left))

    def _say_if_unconnected(self):
        if not self.counters.connected:
            endpoints = " ".join(self.config.connect + self.config.bind)
            self._reporter.say("no receiver yet (retrying every 1 s):", endpoints)

    async def _ship(self):
        """Run reader and sender until input ends (EOF, stop signal or failure),
        then give the sender until the --linger deadline to deliver what was
        read; then cancel and await every task."""
        if self.config.confirm and self._spool is None:
            self._confirmer = Confirmer(self._sender, self._replies, self._confirm_patience,
                                        self.counters, self._queue)
            self._pipeline.admit_with(self._confirmer.admits)
            sender = self._confirmer.run()
        else:
            sender = self._sender.run()
        if self._stdout_closed and (self.config.confirm or self.config.stdout):
            warn("stdout was closed at start: nobody can read "
                 f"{'--confirm replies' if self.config.confirm else '--stdout'}, reading nothing")
            self._reader.stop()
        self._tasks = [self._supervise(self._reader.run(), "reading stdin"),
                       self._supervise(sender, "sending")]
        if self._publisher is not None:
            await self._publisher.start()
        ended = asyncio.get_running_loop().create_task(self._reader.ended.wait())
        await asyncio.wait([ended, self._failed, *self._tasks],
                           return_when=asyncio.FIRST_COMPLETED)
        self._deadline = time.monotonic() + self.config.linger
        if self._publisher is not None:
            self._publisher.stopping(self.counters.not_handed(), self.config.linger)
        self._reader.stop()
        try:
            await self._linger()
        finally:
            self._lingered = time.monotonic() - (self._deadline - self.config.linger)
            for task in [ended, *self._tasks]:
                task.cancel()
            await asyncio.gather(ended, *self._tasks, return_exceptions=True)

    async def _linger(self):
        """Wait until every task is done or the deadline passes; stop at once if
        the sender failed (nothing more can be delivered).  A reader that failed
        before queuing END gets one queued for it, so the sender ends after what
        was read."""
        reader, sender = self._tasks[0], self._tasks[1]
        ending = False
        while True:
            if not ending and failed(reader) and \
                    not isinstance(reader.exception(), InputError):  # raised after END
                self._tasks.append(self._supervise(self._queue.put(END), "ending the queue"))
                ending = True
            pending = [task for task in self._tasks if not task.done()]
            left = self._deadline - time.monotonic()
            if not pending or left <= 0 or failed(sender):
                return
            await asyncio.wait(pending, timeout=left, return_when=asyncio.FIRST_COMPLETED)

    def _supervise(self, coroutine, name: str) -> asyncio.Task:
        """A task whose exception, if any, ends the run (see _fail)."""
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task):
        if failed(task) and isinstance(task.exception(), StdoutClosed):
            self._stdout_gone = True  # --stdout: ends the run as the end of input does
            self._reader.stop()
            if not self._failed.done():
                self._failed.set_result(None)
        elif failed(task):
            self._fail(f"{task.get_name()} failed: {describe(task.exception())}")

    def _on_loop_exception(self, loop, context: dict):
        """The loop's exception handler: an exception in any callback ends the run."""
        exc = context.get("exception")
        where = context.get("message", "a callback")
        self._fail(f"{describe(exc)} ({where})" if exc is not None else where)

    def _fail(self, cause: str):
        """Record the first failure (exit 1) and stop reading; later ones follow from it."""
        if self._cause is None:
            self._cause = " ".join(cause.split())
        self._reader.stop()
        if not self._failed.done():
            self._failed.set_result(None)

    def _report(self, delivered: bool) -> int:
        """Say what went wrong or was left undelivered, print the closing line;
        returns the exit code: 1 after a failure, 3 if any line may not have
        been delivered (not handed over, dropped, still held by ZeroMQ, left
        in the spool, or not waited for with --linger 0), else 0.  With
        --confirm and no spool a line is confirmed only once it is handed over,
        so those not handed were refused or never answered: rsyslog still has
        them, and they count as no loss."""
        counters, spool = self.counters, self._spool
        not_handed = counters.not_handed()
        problems = []
        unreplayed = counters.events_requeued - counters.events_replayed
        if unreplayed > 0:
            problems.append(f"{unreplayed} messages put back to be sent again after a receiver "
                            "went away were not handed to ZeroMQ again in the "
                            f"{round(self._lingered, 3):g}s waited after input ended (--linger "
                            f"{self.config.linger:g}s): lost")
        lost = counters.events_unspooled + self._memory_only_unhanded()
        answered_events, answered_lines = self._answered_lost
        if answered_events or answered_lines:
            held = f" and {answered_lines} lines held" if answered_lines else ""
            problems.append(f"{answered_events} messages{held} whose lines were answered \"OK\" "
                            "to rsyslog (--multiline) were not handed to ZeroMQ within "
                            f"--linger {self.config.linger:g}s: lost")
        confirmed_only = self.config.confirm and spool is None
        if self.config.stdout:
            self._stdout_problems(problems, not_handed)
        elif not confirmed_only and not_handed > lost:
            problems.append(f"{not_handed - lost} messages were not "
                            f"handed to ZeroMQ within --linger {self.config.linger:g}s "
                            "(receiver down or too slow)"
                            + ("; the spool keeps them" if spool is not None else ""))
        left = self._spool_problems(problems) if spool is not None else 0
        if self.config.linger == 0:
            if counters.events_read:
                problems.append("--linger 0: delivery was not waited for")
        elif not delivered and self._linger_left < LINGER_MARGIN:
            problems.append("--linger ran out before ZeroMQ could be let deliver what it "
                            "held: any message still in its queue was dropped")
        elif not delivered:
            problems.append("ZeroMQ still held undelivered messages (at most --sndhwm "
                            f"{self.config.sndhwm} per receiver) when --linger ran out")
        if self._cause is not None:
            more = f" ({not_handed} messages not handed to ZeroMQ)" if not_handed > 0 else ""
            warn(self._cause + more)
            code = EXIT_ERROR
        else:
            for problem in problems:
                warn(problem)
            code = EXIT_UNDELIVERED if problems or counters.events_dropped else EXIT_OK
        closing = (f"Processed {counters.events_handed} messages in "
                   f"{(time.perf_counter() - self._started) * 1000:.4f}ms. "
                   f"Tagged with @pid:{os.getpid()}")
        if counters.events_dropped:
            closing += (f". Dropped {counters.events_dropped} messages "
                        f"({'queue' if spool is None else 'spool'} full)")
        if counters.disconnects:
            closing += (f". Replayed {counters.events_replayed} messages after "
                        f"{counters.disconnects} receiver disconnects")
        if counters.events_refused:
            closing += f". Refused {counters.events_refused} lines to rsyslog (it sends them again)"
        if self.config.multiline is not None:
            closing += (f". Joined {counters.lines_joined} lines into "
                        f"{counters.events_joined} multi-line events "
                        f"({counters.events_cut} cut at a cap"
                        + (f", {counters.events_pushed_out} pushed out unfinished past "
                           "the source caps" if counters.events_pushed_out else "") + ")")
        if spool is not None:
            closing += self._spool_closing(left)
        closing += json_closing(counters.json_failures, counters.json_fixed)
        write_stderr(closing + "\n")
        return code

    def _stdout_problems(self, problems: list, not_written: int):
        """Add what --stdout did not write to problems."""
        if self._stdout_gone:
            problems.append(f"stdout was closed by its reader: {not_written} messages "
                            "read were not written")
        elif not_written:
            problems.append(f"{not_written} messages were not written to stdout within "
                            f"--linger {self.config.linger:g}s (its reader too slow)")

    def _spool_problems(self, problems: list) -> int:
        """Add what the spool lost or keeps to problems; returns the bytes it keeps."""
        counters, spool = self.counters, self._spool
        if counters.events_unspooled:
            problems.append(f"{counters.events_unspooled} messages read could not be "
                            "written to the spool before the run ended: lost")
        memory_only = self._memory_only_unhanded()
        if memory_only:
            problems.append(f"{memory_only} messages kept in memory only (the spool could "
                            "not take them) were not handed to ZeroMQ: lost")
        left = spool.end - spool.position
        if left:
            problems.append(f"{left} bytes stay in the spool {spool.directory}: "
                            "the next run on it sends them first")
        return left

    def _memory_only_unhanded(self) -> int:
        """Events kept in memory only (see SpoolQueue) not handed to ZeroMQ."""
        if self._spool is None:
            return 0
        return self._queue.memory_only_events() + self._sender.unhanded_events(False)

    def _spool_closing(self, left: int) -> str:
        """The closing line's spool part: what came from a previous run, what
        was damaged, what stays."""
        counters, text = self.counters, ""
        if counters.events_found:
            text += f". Read {counters.events_found} messages a previous run left in the spool"
        if counters.spool_corrupt:
            text += f". Skipped {counters.spool_corrupt} damaged stretches of the spool"
        if counters.events_memory_only:
            text += (f". Kept {counters.events_memory_only} messages in memory only "
                     "(the spool could not take them)")
        return text + f". Spooled: {left} bytes left in {self._spool.directory}"

    def _install_signals(self):
        """The run's handlers; then a stop signal that came while zmqpush
        started (the launcher blocked it, so it is pending) is taken: what
        stdin holds by then is read and shipped, and reading stops."""
        loop = asyncio.get_running_loop()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        stops = stop_signals()
        for signum in stops:
            loop.add_signal_handler(signum, self._on_stop_signal, signum)
        loop.add_signal_handler(signal.SIGUSR1, self._pipeline.report,
                                self._reporter.print_stats)
        early = [signal.sigtimedwait(stops, 0) for _ in stops if signal.sigpending() & stops]
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stops)
        if any(early):
            self._stop_signals = 1
            self._reader.stop_when_read()

    def _on_stop_signal(self, signum: int):
        """First SIGTERM/SIGINT: stop reading and linger.  Second: exit now."""
        self._stop_signals += 1
        if self._stop_signals == 1:
            self._reader.stop()
            return
        warn(f"interrupted: {self.counters.not_handed()} messages not handed to ZeroMQ")
        os._exit(EXIT_SIGNAL_BASE + signum)


def stop_signals() -> set:
    """SIGTERM, and SIGINT unless it was ignored when zmqpush started (as
    omprog starts it: then it stays ignored)."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        return {signal.SIGTERM}
    return {signal.SIGTERM, signal.SIGINT}


def failed(task: asyncio.Task) -> bool:
    """True if task ended with an exception (not cancelled, not still running)."""
    return task.done() and not task.cancelled() and task.exception() is not None


def describe(exc: BaseException) -> str:
    """An exception as a short phrase for one diagnostic line."""
    if isinstance(exc, InputError):
        return str(exc)
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def reopen_closed_std_fds() -> set:
    """Open /dev/null on each of descriptors 0, 1 and 2 that is closed; returns
    those that were.  Without this the loop or ZeroMQ would get those numbers
    (uvloop aborts then, and stdout or stderr would be one of their sockets)."""
    closed = set()
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
        except OSError:
            closed.add(fd)
    for fd in sorted(closed):
        null = os.open(os.devnull, os.O_RDWR)
        if null != fd:
            os.dup2(null, fd)
            os.close(null)
    return closed


# glibc's mallopt parameter, and the size from which blocks get their own mapping.
M_MMAP_THRESHOLD = -3
LARGE_BLOCK_BYTES = 256 << 10


def map_large_blocks(config: Config) -> bool:
    """For settings with messages past the defaults' (longer lines, larger
    reads), have glibc map every block of LARGE_BLOCK_BYTES or more on its own,
    so that freeing it returns it to the system.  Left to itself glibc raises
    that threshold to the largest block freed (up to 32 MiB): escaped megabyte
    lines then come from the heap, where small objects between them keep it
    from shrinking (measured: 78 MiB peak against 51 MiB, 1 MiB lines of NULs
    between short ones).  Returns True if set; ctypes (4 ms to import) is paid
    only then."""
    if config.max_line_bytes <= DEFAULT_MAX_LINE_BYTES and \
            (not config.batch or config.batch_bytes <= DEFAULT_READ_BYTES):
        return False
    try:
        import ctypes
        return ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES) == 1
    except (ImportError, OSError, AttributeError):  # not glibc
        return False


def json_closing(failures: int, fixed: int) -> str:
    """The closing line's --json/--journal part: how many lines were not JSON
    objects (sent as text) and how many events had a field moved or noted,
    each left out when 0; "" when both are."""
    parts = []
    if failures:
        parts.append(f"{failures} line was not a JSON object and went as text"
                     if failures == 1 else
                     f"{failures} lines were not JSON objects and went as text")
    if fixed:
        parts.append(f"{fixed} {'event' if fixed == 1 else 'events'} had a field "
                     "moved or noted")
    return f". {'; '.join(parts)} ({JSON_ERROR_KEY} says why)" if parts else ""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop if uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def main(argv=None) -> int:
    """The command line: returns the exit code (see --help)."""
    closed = reopen_closed_std_fds()
    try:
        config = parse_options(argv)
    except UsageError as exc:
        warn(f"{exc} (see {help_for(str(exc))})")
        return EXIT_USAGE
    except ImportError as exc:  # certificates are read with pyzmq: a broken install
        warn(f"failed: {exc}")
        return EXIT_ERROR
    short = raise_descriptor_limit(config)
    if short is not None:
        warn(short)
        return EXIT_USAGE
    map_large_blocks(config)
    loop = new_event_loop()
    try:
        return loop.run_until_complete(Shipper(config, stdout_closed=1 in closed).run())
    except Exception as exc:  # a failure outside the supervised run: one line, no traceback
        warn(f"failed: {describe(exc)}")
        return EXIT_ERROR
    finally:
        signal.pthread_sigmask(signal.SIG_BLOCK, stop_signals())  # the result stands
        loop.close()
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the loop's handlers are gone
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)


if __name__ == "__main__":
    sys.exit(main())
