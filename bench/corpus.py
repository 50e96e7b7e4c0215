#!/usr/bin/env python3
"""Write a realistic log corpus: syslog-like lines of about 100 bytes, or with
--json the JSON lines of a structured logger (zap, structlog) of about 200.

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


def write_corpus(path: str, count: int, seed: int = 1, kind: str = "text") -> int:
    """Write count lines (kind "text" or "json") to path; returns the byte size."""
    rnd = random.Random(seed)
    make = json_line if kind == "json" else line
    with open(path, "wb") as out:
        out.write(b"".join(make(rnd, n) + b"\n" for n in range(count)))
        return out.tell()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("path")
    p.add_argument("--lines", type=int, default=1_000_000)
    p.add_argument("--json", action="store_true", help="JSON lines of a structured logger")
    args = p.parse_args()
    size = write_corpus(args.path, args.lines, kind="json" if args.json else "text")
    print(f"{args.lines} lines, {size / args.lines:.0f} bytes/line", file=sys.stderr)
