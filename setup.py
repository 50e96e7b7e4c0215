"""Install zmqpush (README.md's first command): the zmqpush module, which pip compiles to
bytecode once, and the zmqpush.py and zmqpush-watermark.py commands on PATH.

The installed zmqpush.py command is a small launcher, not a copy of the
module: a script is compiled from source at every start (150 ms or so for
zmqpush.py), an installed module is not.  The launcher ignores HUP and USR1
and blocks TERM and INT (unless INT is ignored) before the imports, until the
run takes them, and sends again a SIGINT that CPython dropped just before running
it, as zmqpush.py itself does when run from a checkout (README "Exit codes and signals").
"""
import os

from setuptools import setup

try:
    from setuptools.command.build_scripts import build_scripts
except ImportError:  # setuptools before 69
    from distutils.command.build_scripts import build_scripts

from zmqpush import __version__

LAUNCHER = '''#!python
"""zmqpush.py: ship stdin as JSON over ZeroMQ (see zmqpush.py --help).
The installed command: runs the zmqpush module, compiled when installed."""
import _signal  # the builtin under signal, without its enum import (8 ms sooner)
import os
import sys

# A stop signal waits, blocked, until the run takes it (and ships what stdin holds).
_signal.pthread_sigmask(_signal.SIG_BLOCK, {_signal.SIGTERM} | (
    {_signal.SIGINT} if _signal.getsignal(_signal.SIGINT) is not _signal.SIG_IGN else set()))
_signal.signal(_signal.SIGHUP, _signal.SIG_IGN)
_signal.signal(_signal.SIGUSR1, _signal.SIG_IGN)
# A SIGINT that came while CPython looked at this file's path, just before running it,
# was printed as a KeyboardInterrupt and dropped: sent again, it waits as above.  Only
# when CPython runs this file itself: run by a REPL (runpy, IPython's %run), an older
# Ctrl-C's KeyboardInterrupt may be in sys.last_value.
if sys._getframe().f_back is None and isinstance(getattr(sys, "last_value", None),
                                                 KeyboardInterrupt):
    os.kill(os.getpid(), _signal.SIGINT)
# This file is named zmqpush.py too: import the module, not this file (its directory
# may be on the path more than once: first as the script's, again by PYTHONPATH).
_here = os.path.dirname(os.path.realpath(__file__))
sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or ".") != _here]

from zmqpush import main  # noqa: E402

raise SystemExit(main())
'''


WATERMARK_FLAG = "\nINSTALLED = False\n"


def installed_watermark() -> str:
    """zmqpush-watermark.py as installed: INSTALLED = True, so that in bin/ it imports the
    zmqpush module, not the zmqpush.py launcher beside it."""
    with open("zmqpush-watermark.py", encoding="utf-8") as f:
        source = f.read()
    if source.count(WATERMARK_FLAG) != 1:
        raise SystemExit("setup.py: zmqpush-watermark.py lost its INSTALLED = False line")
    return source.replace(WATERMARK_FLAG, "\nINSTALLED = True\n")


class BuildLaunchers(build_scripts):
    """Build the installed commands: zmqpush.py from LAUNCHER instead of the module's
    source, and zmqpush-watermark.py marked as installed."""

    def run(self):
        built_dir = self.build_dir + "-launcher"
        os.makedirs(built_dir, exist_ok=True)
        built = {"zmqpush.py": LAUNCHER, "zmqpush-watermark.py": installed_watermark()}
        for name, text in built.items():
            with open(os.path.join(built_dir, name), "w", encoding="utf-8") as f:
                f.write(text)
        self.scripts = [os.path.join(built_dir, os.path.basename(s)) for s in self.scripts]
        super().run()


setup(
    name="zmqpush",
    version=__version__,
    description="Ship log lines from stdin to Logstash over a ZeroMQ PUSH socket, as JSON",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    license="MIT",
    py_modules=["zmqpush"],
    scripts=["zmqpush.py", "zmqpush-watermark.py"],
    cmdclass={"build_scripts": BuildLaunchers},
    python_requires=">=3.9",
    # Lower bounds are the versions the test suite runs against (.ci/run).
    install_requires=["pyzmq>=27.0", "aiozmq>=1.0.0", "uvloop>=0.21"],
    # bench: bench/paced.py --chart draws with matplotlib; test: tests/test_service.py
    # parses --metrics-file with prometheus_client's parser, pytest-xdist runs the tests
    # in parallel (tests/pytest.ini) (never runtime dependencies)
    extras_require={"test": ["pytest>=8", "pytest-xdist>=3.5", "hypothesis>=6.100",
                             "prometheus_client"],
                    "bench": ["matplotlib"]},
    classifiers=[
        "Programming Language :: Python :: 3",
        "Operating System :: POSIX :: Linux",
        "Topic :: System :: Logging",
    ],
)
