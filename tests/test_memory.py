"""Issue 10, item 5: at the default settings memory stays under 64 MiB RSS whatever
the shape of the input; settings whose worst case exceeds --memory-bytes are refused."""
import subprocess
import sys
import threading
import time

import pytest

from conftest import SINK, cli, env_with, free_port, vm_peak_rss_kib

MIB = 1 << 20
SHAPES = {
    "empty-lines": (b"\n" * 1_000_000, 1_000_000),
    "nul-no-newline": (b"\x00" * (30 * MIB), None),
    "cr-no-newline": (b"\r" * (30 * MIB), None),
    "quote-lines": ((b'"' * 1000 + b"\n") * 30_000, 30_000),
    "nul-lines": ((b"\x00" * 1000 + b"\n") * 30_000, 30_000),
    "huge-then-tiny": ((b"\\" * 200_000 + b"\n" + b"\n" * 50_000) * 20, None),
}


def ship(args: list, data: bytes) -> tuple:
    """Ship data through a pipe to a validating receiver; returns (exit code, peak
    RSS in KiB, the receiver's summary line)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    sink = subprocess.Popen([sys.executable, SINK, "--bind", endpoint, "--quiet", "--idle", "3"],
                            stdout=subprocess.PIPE, text=True)
    proc = subprocess.Popen(cli("-q", "-c", endpoint, *args), stdin=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env_with(None))
    writer = threading.Thread(target=feed, args=(proc, data), daemon=True)
    writer.start()
    peak = 0
    try:
        while proc.poll() is None:  # VmHWM only grows; read it until the end
            peak = max(peak, peak_rss_kib(proc.pid))
            time.sleep(0.01)
        writer.join(10)
        summary = sink.communicate(timeout=60)[0].strip()
    finally:
        for p in (proc, sink):
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return proc.returncode, peak, summary


def peak_rss_kib(pid: int) -> int:
    """VmHWM of a running process (0 once it has gone).  (A child's ru_maxrss
    would count the test process's own pages, shared between fork and exec.)"""
    try:
        return vm_peak_rss_kib(pid)
    except (OSError, AssertionError):
        return 0


def feed(proc, data: bytes):
    try:
        for i in range(0, len(data), MIB):
            proc.stdin.write(data[i:i + MIB])
        proc.stdin.close()
    except BrokenPipeError:
        pass


@pytest.mark.parametrize("mode", [[], ["--batch"]], ids=["default", "batch"])
@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_input_shape_stays_under_64_mib(shape, mode):
    data, lines = SHAPES[shape]
    code, peak_kib, summary = ship(mode, data)
    assert code == 0
    words = summary.split()
    assert words[0] == "received" and words[3] == "(0" and words[4] == "invalid)", summary
    if lines is not None:
        assert int(words[1]) == lines, summary
    assert peak_kib < 64 * 1024, peak_kib


def test_a_3_mb_line_cut_into_4_byte_pieces_stays_under_64_mib():
    code, peak_kib, summary = ship(["--max-line-bytes", "4"], b"a" * 3_000_000 + b"\n")
    assert code == 0
    assert summary.startswith("received 750000 events (0 invalid)"), summary
    assert peak_kib < 64 * 1024, peak_kib


@pytest.mark.parametrize("args", [
    ["--max-line-bytes", str(MIB)], ["--queue-bytes", str(40 * MIB)],
    ["--replay-bytes", str(40 * MIB)], ["--batch", "--batch-bytes", str(4 * MIB)],
])
def test_settings_whose_worst_case_exceeds_the_limit_are_refused(args):
    proc = subprocess.run(cli(*args), input=b"x\n", capture_output=True, timeout=20,
                          env=env_with(None))
    assert proc.returncode == 2
    assert proc.stderr.startswith(b"zmqpush: these settings may need ")
    assert len(proc.stderr.splitlines()) == 1
    raised = subprocess.run(cli(*args, "--memory-bytes", str(1 << 30), "--linger", "0.2",
                                "-c", "tcp://127.0.0.1:9"), input=b"", capture_output=True,
                            timeout=20, env=env_with(None))
    assert raised.returncode == 0, raised.stderr
