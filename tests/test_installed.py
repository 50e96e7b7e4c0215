"""Issue 22: the commands `pip install .` puts on PATH work wherever a user stands.

bin/ holds the zmqpush.py launcher beside zmqpush-watermark.py, so a command that
imports the zmqpush module from there must find the module, not the launcher.
"""
import json
import os
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, WATERMARK, ZMQPUSH, env_with, run, unstamped

SHADOW = 'raise SystemExit("the zmqpush.py in the current directory was imported")\n'


def working_directories(tmp_path: Path) -> dict:
    """Where a user may stand: bin/ itself, a folder with a zmqpush.py of its own, /."""
    shadowed = tmp_path / "shadowed"
    shadowed.mkdir()
    (shadowed / "zmqpush.py").write_text(SHADOW)
    return {"bin": BIN, "shadowed": shadowed, "root": Path("/")}


@pytest.mark.parametrize("where", ["bin", "shadowed", "root"])
def test_the_watermark_tool_runs_from_any_directory(tmp_path, where):
    cwd = working_directories(tmp_path)[where]
    for command in (WATERMARK, "./zmqpush-watermark.py") if where == "bin" else (WATERMARK,):
        proc = subprocess.run([command, "--json", "--sndhwm", "7"], cwd=cwd,
                              capture_output=True, timeout=30)
        assert proc.returncode == 0, proc.stderr
        assert proc.stderr == b""
        assert json.loads(proc.stdout)["sndhwm"] == 7


@pytest.mark.parametrize("where", ["bin", "shadowed", "root"])
def test_zmqpush_ships_from_any_directory(tmp_path, receiver, where):
    cwd = working_directories(tmp_path)[where]
    proc = subprocess.run([ZMQPUSH, "-c", receiver.endpoint, where], input=b"from here\n",
                          cwd=cwd, capture_output=True, timeout=30)
    assert proc.returncode == 0, proc.stderr
    assert receiver.wait_for(1) == 1
    assert receiver.events()[0]["message"] == "from here"
    assert receiver.events()[0]["type"] == where


def test_the_installed_zmqpush_is_the_launcher_and_the_tool_is_marked_installed():
    launcher = Path(ZMQPUSH).read_text()
    assert "from zmqpush import main" in launcher and len(launcher) < 2048
    assert "\nINSTALLED = True\n" in Path(WATERMARK).read_text()


@pytest.mark.parametrize("command", [ZMQPUSH, WATERMARK], ids=["zmqpush", "watermark"])
def test_help_and_version_of_each_installed_command(command):
    helped = subprocess.run([command, "--help"], capture_output=True, timeout=30)
    assert helped.returncode == 0, helped.stderr
    assert b"usage: " + Path(command).name.encode() in helped.stdout
    assert helped.stderr == b""
    version = subprocess.run([command, "--version"], capture_output=True, timeout=30)
    assert version.returncode == 0, version.stderr
    assert version.stdout.decode().startswith("zmqpush ")


def test_make_cert_through_the_installed_command(tmp_path):
    proc = run(["--make-cert", str(tmp_path / "pair")])
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "pair.key").is_file() and (tmp_path / "pair.key_secret").is_file()
    again = run(["--make-cert", str(tmp_path / "pair")])
    assert again.returncode == 2 and unstamped(again.stderr).startswith(b"zmqpush: ")


@pytest.mark.parametrize("where", ["bin", "root"])
@pytest.mark.parametrize("command", [ZMQPUSH, WATERMARK], ids=["zmqpush", "watermark"])
def test_the_commands_run_with_their_own_directory_on_pythonpath(command, where, tmp_path):
    """bin/ named again by PYTHONPATH, or as its empty entry (the current directory),
    must not make the launcher import itself."""
    cwd = working_directories(tmp_path)[where]
    for pythonpath in (str(BIN), ":/nonexistent"):
        proc = subprocess.run([command, "--version"], cwd=cwd, capture_output=True,
                              timeout=30, env=env_with({"PYTHONPATH": pythonpath}))
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.startswith(b"zmqpush ")


def test_the_watermark_tool_runs_with_docstrings_stripped():
    proc = subprocess.run([WATERMARK, "--help"], capture_output=True, timeout=30,
                          env=env_with({"PYTHONOPTIMIZE": "2"}))
    assert proc.returncode == 0, proc.stderr
    assert b"Print the watermarks" in proc.stdout


@pytest.mark.parametrize(("redirect", "code", "said"), [
    (">&-", 0, []),  # closed stdout: opened on /dev/null (README "Exit codes and signals")
    (">/dev/full", 1, ["zmqpush: cannot write to stdout: No space left on device"])])
def test_make_cert_whose_stdout_cannot_be_written_never_gives_a_traceback(
        tmp_path, redirect, code, said):
    proc = subprocess.run(["sh", "-c", f'exec "$0" --make-cert "$1" {redirect}', ZMQPUSH,
                           str(tmp_path / "pair")], capture_output=True, timeout=30)
    assert proc.returncode == code
    assert unstamped(proc.stderr).decode().splitlines() == said
    assert (tmp_path / "pair.key").is_file()


def test_a_spool_never_takes_over_a_directory_holding_other_files(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "notes.txt").write_text("mine\n")
    proc = run(["--spool", str(data), "-c", "tcp://127.0.0.1:9"], b"line\n")
    assert proc.returncode == 2
    assert unstamped(proc.stderr).decode().splitlines() == [
        f"zmqpush: cannot use --spool {data}: 'notes.txt' in it is not a spool's file (give "
        "a new or empty directory, or a spool)"]
    assert sorted(p.name for p in data.iterdir()) == ["notes.txt"]


def test_a_spool_never_overwrites_a_position_file_it_did_not_write(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "position").write_text("IMPORTANT USER DATA\n")
    proc = run(["--spool", str(data), "-c", "tcp://127.0.0.1:9"], b"line\n")
    assert proc.returncode == 2
    assert b"'position' in it is not a spool's file" in proc.stderr
    assert (data / "position").read_text() == "IMPORTANT USER DATA\n"
    assert sorted(p.name for p in data.iterdir()) == ["position"]


def test_a_fifo_named_like_a_segment_is_refused_not_opened(tmp_path):
    """Opening it to append would block for good (no writer, no reader)."""
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "00000000000000000000.seg")
    proc = run(["--spool", str(data), "-c", "tcp://127.0.0.1:9", "--linger", "0"], b"x\n",
               timeout=20)
    assert proc.returncode == 2
    assert b"'00000000000000000000.seg' in it is not a spool's file" in proc.stderr
    assert sorted(p.name for p in data.iterdir()) == ["00000000000000000000.seg"]
