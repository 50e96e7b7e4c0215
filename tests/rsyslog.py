"""A private rsyslogd for tests and benchmarks: its own config, work directory and
TCP input on 127.0.0.1, no /dev/log, started and stopped by PID."""
import glob
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from ports import free_port

RSYSLOGD = shutil.which("rsyslogd") or "/usr/sbin/rsyslogd"

CONFIG = """\
global(workDirectory="{work}" processInternalMessages="on" maxMessageSize="64k"
       {escaping})
module(load="imuxsock" SysSock.Use="off")
module(load="imtcp")
{modules}
template(name="msgonly" type="string" string="%msg%\\n")
{rules}
input(type="imtcp" address="127.0.0.1" port="{port}" ruleset="ship")
"""
# rsyslog's default turns a control character (a tab) into "#011"; escaping=""
# leaves the default (README "Structured logs" sets it off in its own global()).
ESCAPING_OFF = 'parser.escapeControlCharactersOnReceive="off"'


def available() -> bool:
    return os.path.exists(RSYSLOGD)


def imczmq_available() -> bool:
    """rsyslogd and its imczmq module (Debian: rsyslog-czmq) are installed."""
    return available() and any(Path(d, "rsyslog", "imczmq.so").exists()
                               for d in ("/usr/lib", *glob.glob("/usr/lib/*-linux-gnu")))



def syslog_frame(message: str) -> bytes:
    """One RFC 5424 message, newline-framed, whose %msg% is exactly message."""
    return f"<13>1 - - app - - - {message}\n".encode()


class PrivateRsyslog:
    """rsyslogd -n whose TCP input feeds the ruleset "ship".

    Give action (RainerScript, wrapped in that ruleset) or rules (config text
    that defines the ruleset itself, e.g. in legacy syntax); env is rsyslogd's
    environment, which omprog passes on to its program; escaping: global()'s
    control character option (ESCAPING_OFF, or "" for rsyslog's default)."""

    def __init__(self, workdir: Path, action: str = "", modules: str = 'module(load="omprog")',
                 rules: str = "", env=None, *, escaping: str = ESCAPING_OFF):
        self._prepare(workdir, free_port(), env)
        rules = rules or f'ruleset(name="ship") {{\n{action}\n}}'
        self.conf.write_text(CONFIG.format(work=self.workdir, port=self.port, escaping=escaping,
                                           modules=modules, rules=rules))

    def _prepare(self, workdir, port: int, env):
        """Work directory, file names and port; the caller writes self.conf."""
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.port = port
        self.conf = self.workdir / "rsyslog.conf"
        self.pidfile = self.workdir / "rsyslogd.pid"
        self.log = self.workdir / "rsyslogd.out"
        self.env = env
        self.proc = None

    def start(self, timeout: float = 10.0):
        with open(self.log, "wb") as out:
            self.proc = subprocess.Popen(
                [RSYSLOGD, "-n", "-f", str(self.conf), "-i", str(self.pidfile)],
                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=self.env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"rsyslogd exited: {self.log.read_text()}")
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                return self
            except OSError:
                time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"rsyslogd did not open its TCP port: {self.log.read_text()}")

    def send(self, messages, chunk: int = 2000):
        """Send messages over one TCP connection, as fast as it takes them."""
        with socket.create_connection(("127.0.0.1", self.port)) as conn:
            for i in range(0, len(messages), chunk):
                conn.sendall(b"".join(syslog_frame(m) for m in messages[i:i + chunk]))

    def children(self) -> list:
        """PIDs of rsyslogd's child processes (the omprog programs)."""
        pids = []
        for task in Path(f"/proc/{self.proc.pid}/task").glob("*"):
            try:
                pids += [int(p) for p in (task / "children").read_text().split()]
            except OSError:
                pass
        return pids

    def stop(self, timeout: float = 30.0) -> float:
        """SIGTERM rsyslogd and wait for it; returns the seconds it took."""
        began = time.monotonic()
        if self.proc and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.kill(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
        return time.monotonic() - began


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[-1][0] != "Z"
    except OSError:
        return False


IMCZMQ_CONFIG = """\
global(workDirectory="{work}" processInternalMessages="on" maxMessageSize="{max_size}")
module(load="imuxsock" SysSock.Use="off")
{imczmq_module}
main_queue(queue.workerThreads="1" queue.size="{queue_size}")
template(name="raw" type="string" string="%rawmsg%\\n")
ruleset(name="r") {{
  action(type="omfile" file="{output}" template="raw")
}}
input(type="imczmq" endpoints="@tcp://127.0.0.1:{port}" socktype="PULL" ruleset="r")
"""


class ImczmqRsyslog(PrivateRsyslog):
    """rsyslogd -n as a C ZeroMQ receiver: imczmq binds a PULL socket on
    tcp://127.0.0.1:port and omfile writes each message it receives exactly as
    received (%rawmsg%) plus a newline to `output`, in the order received (one
    queue worker).  max_size is rsyslog's maxMessageSize; queue_size its main
    queue's bound in messages, large so that a full queue never drops.
    curve=(server certificate, clients directory) makes it a CURVE server that
    admits only those clients, configured as README "Security" shows."""

    def __init__(self, workdir, port: int, output, max_size: str = "64k",
                 queue_size: int = 1_000_000, *, curve=None):
        self._prepare(workdir, port, None)
        self.output = Path(output)
        module = 'module(load="imczmq")'
        if curve is not None:
            module = (f'module(load="imczmq" authtype="CURVESERVER" servercertpath="{curve[0]}"'
                      f' clientcertpath="{curve[1]}/" authenticator="on")')
        self.conf.write_text(IMCZMQ_CONFIG.format(
            work=self.workdir, port=port, output=self.output, max_size=max_size,
            queue_size=queue_size, imczmq_module=module))

    def received(self) -> list:
        """The messages written so far, as bytes, without a last unfinished one."""
        try:
            data = self.output.read_bytes()
        except FileNotFoundError:
            return []
        return data.split(b"\n")[:-1]
