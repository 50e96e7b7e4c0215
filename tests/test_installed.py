"""Issue 22: the commands `pip install .` puts on PATH work wherever a user stands.

bin/ holds the zmqpush.py launcher beside zmqpush-watermark.py, so a command that
imports the zmqpush module from there must find the module, not the launcher.
"""
import json
import subprocess
from pathlib import Path

import pytest

from conftest import BIN, WATERMARK, ZMQPUSH, run

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
    assert again.returncode == 2 and again.stderr.startswith(b"zmqpush: ")
