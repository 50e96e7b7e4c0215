"""Build the benchmarks' C programs (bench/cship.c, bench/ccount.c) on demand.

build(name) compiles bench/<name>.c with `cc -O2 ... -lzmq` into bench/.build/
when the binary is missing or older than its source, and returns its path.
Counter runs bench/ccount.c, the C counting receiver, on 127.0.0.1.
"""
import os
import re
import select
import shutil
import signal
import subprocess
from pathlib import Path

HERE = Path(__file__).resolve().parent
BUILD = HERE / ".build"
CC = os.environ.get("CC") or shutil.which("cc") or "cc"


class BuildError(RuntimeError):
    pass


def build(name: str) -> str:
    """Path of bench/<name>.c compiled, rebuilt only when its source is newer."""
    source = HERE / f"{name}.c"
    binary = BUILD / name
    if binary.exists() and binary.stat().st_mtime >= source.stat().st_mtime:
        return str(binary)
    BUILD.mkdir(exist_ok=True)
    partial = BUILD / f".{name}.{os.getpid()}"  # renamed at the end: builds may race
    try:
        done = subprocess.run([CC, "-O2", "-Wall", "-o", str(partial), str(source), "-lzmq"],
                              capture_output=True, text=True)
    except FileNotFoundError:
        raise BuildError(f"no C compiler ({CC}): apt-get install gcc libzmq3-dev")
    if done.returncode != 0:
        partial.unlink(missing_ok=True)
        if "zmq.h" in done.stderr:
            raise BuildError("zmq.h is missing: apt-get install libzmq3-dev")
        raise BuildError(f"{CC} failed on {source}:\n{done.stderr}")
    os.replace(partial, binary)
    return str(binary)


class Counter:
    """bench/ccount.c bound on tcp://127.0.0.1 (a free port), with --stay: once
    count events (0: no limit) arrived it reports but stays connected until
    finish(), so a sender still closing never sees its receiver go away."""

    def __init__(self, count: int = 0, idle: float = 10.0, needle: str = ""):
        """needle: what to count as an event instead of {"message": (CCOUNT_NEEDLE)."""
        self.proc = subprocess.Popen(
            [build("ccount"), "tcp://127.0.0.1:*", str(count), str(idle), "--stay"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=dict(os.environ, CCOUNT_NEEDLE=needle))
        bound = self.proc.stderr.readline().split()
        if bound[:2] != ["ccount:", "bound"]:
            self.proc.kill()
            self.proc.wait()
            raise RuntimeError(f"ccount did not bind: {' '.join(bound)}")
        self.endpoint = bound[2]

    def finish(self, timeout: float) -> dict:
        """Wait up to timeout for its report (count reached, or idle), stop it (by
        PID) and return received (events when it reported, or at the end), more
        (events after that), frames, first and last (time.monotonic() of the
        first and last frame counted; 0 when none came)."""
        select.select([self.proc.stdout], [], [], timeout)
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            out, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate()
        got = re.search(r"received (\d+) events", out)
        more = re.search(r"then (\d+) more events", out)
        times = re.search(r"(\d+) frames, first at ([0-9.]+), last at ([0-9.]+)", err)
        return {"received": int(got[1]) if got else 0, "more": int(more[1]) if more else 0,
                "frames": int(times[1]) if times else 0,
                "first": float(times[2]) if times else 0.0,
                "last": float(times[3]) if times else 0.0}


if __name__ == "__main__":
    import sys
    for arg in sys.argv[1:] or ["cship", "ccount"]:
        print(build(arg))
