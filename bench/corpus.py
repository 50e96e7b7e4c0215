#!/usr/bin/env python3
"""Write a realistic log corpus: syslog-like lines of about 100 bytes, or with
--json the JSON lines of a structured logger (zap, structlog) of about 200, or
with --kind docker, cri the text lines as container runtimes write them.

Most lines are plain ASCII; some carry quotes, tabs, backslashes, non-ASCII text,
control characters or invalid UTF-8, as real logs do (JSON lines: escaped in the
JSON).  Deterministic for a seed.
"""
import argparse
import json
import random
import sys

APPS = ["sshd", "nginx", "kernel", "cron", "postfix/smtpd", "app", "systemd"]
WORDS = ["connection", "from", "user", "session", "opened", "closed", "request", "GET",
         "/api/v1/items", "status=200", "latency_ms=12", "retry", "timeout", "ok", "id"]
SPICE = ['"quoted value"', "tab\there", "C:\\path\\file", "café", "Grüße", "日本語",
         "emoji 😀", "\x1b[0m", "bad \xff\xfe bytes"]


def line(rnd: random.Random, n: int) -> bytes:
    words = " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(6, 11)))
    text = (f"Nov 21 12:{n // 60 % 60:02d}:{n % 60:02d} host{n % 7} {rnd.choice(APPS)}"
            f"[{1000 + n % 5000}]: {words} n={n}")
    if rnd.random() < 0.3:
        text += " " + rnd.choice(SPICE)
    return text.encode("utf-8", "surrogateescape").replace(
        "\xff\xfe".encode(), b"\xff\xfe")


def json_line(rnd: random.Random, n: int) -> bytes:
    """One JSON object as a structured logger writes it (non-ASCII as it is)."""
    event = {"level": rnd.choice(["info", "info", "info", "warn", "error", "debug"]),
             "ts": 1763700000 + n / 1000, "logger": rnd.choice(APPS),
             "msg": " ".join(rnd.choice(WORDS) for _ in range(rnd.randint(3, 7))),
             "method": "GET", "path": "/api/v1/items", "status": 200,
             "latency_ms": n % 97, "n": n}
    if rnd.random() < 0.3:
        event["detail"] = rnd.choice(SPICE).replace("\xff\xfe", "??")
    return json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()


def runtime_time(n: int) -> str:
    """The runtime's time of line n, RFC 3339 with nanoseconds, as both write it."""
    minutes, seconds = n // 60_000_000 % 60, n // 1_000_000 % 60
    return f"2026-11-27T10:{minutes:02d}:{seconds:02d}.{n % 1_000_000:06d}123Z"


def docker_line(rnd: random.Random, n: int) -> bytes:
    """A text line as dockerd's json-file driver writes it (invalid UTF-8 as U+FFFD)."""
    log = line(rnd, n).decode("utf-8", "replace") + "\n"
    return json.dumps({"log": log, "stream": "stderr" if n % 10 == 0 else "stdout",
                       "time": runtime_time(n)}, ensure_ascii=False,
                      separators=(",", ":")).encode()


def cri_line(rnd: random.Random, n: int) -> bytes:
    """A text line as CRI runtimes (containerd, conmon) write it."""
    stream = b"stderr" if n % 10 == 0 else b"stdout"
    return runtime_time(n).encode() + b" " + stream + b" F " + line(rnd, n)


KINDS = {"text": line, "json": json_line, "docker": docker_line, "cri": cri_line}


def write_corpus(path: str, count: int, seed: int = 1, kind: str = "text") -> int:
    """Write count lines (kind: one of KINDS) to path; returns the byte size."""
    rnd = random.Random(seed)
    make = KINDS[kind]
    with open(path, "wb") as out:
        out.write(b"".join(make(rnd, n) + b"\n" for n in range(count)))
        return out.tell()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--json", action="store_true", help="JSON lines of a structured logger")
    p.add_argument("--kind", choices=tuple(KINDS), default="text",
                   help="or text lines as Docker's json-file (docker) or CRI logs (cri) hold them")
    args = p.parse_args()
    size = write_corpus(args.path, args.lines, kind="json" if args.json else args.kind)
    print(f"{args.lines} lines, {size / args.lines:.0f} bytes/line", file=sys.stderr)
