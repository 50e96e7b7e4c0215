"""Build the benchmarks' C programs (bench/cship.c, bench/ccount.c) on demand.

build(name) compiles bench/<name>.c with `cc -O2 ... -lzmq` into bench/.build/
when the binary is missing or older than its source, and returns its path.
"""
import os
import shutil
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


if __name__ == "__main__":
    import sys
    for arg in sys.argv[1:] or ["cship", "ccount"]:
        print(build(arg))
