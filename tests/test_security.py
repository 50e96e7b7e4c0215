"""Issue 17: CURVE in both modes, a bind mode that admits only whom you allow
(--curve-clients, --allow), clear failures for bad certificates and refusals.

Everything is real: key pairs made by `zmqpush.py --make-cert`, pyzmq PULL
receivers with CURVE, rsyslogd's imczmq as a CURVE server written in C, peers
connecting from 127.0.0.2, and a recording TCP proxy on loopback for what goes
over the wire."""
import os
import re
import select
import shutil
import socket
import subprocess
import threading
import time

import pytest
import zmq
import zmq.auth
from rsyslog import ImczmqRsyslog, imczmq_available
from test_imczmq import LOGTYPE, expected_json, hostile_lines
from test_shipping import wakeups_once_settled

import zmqpush
from conftest import (
    Receiver,
    cli,
    env_with,
    free_port,
    run,
    start,
    stop_process,
    unstamped,
    vm_peak_rss_kib,
    wait_stop_signals_taken,
    wait_until,
)

SECRET_MARK = b"password=hunter2"


@pytest.fixture(scope="module")
def certs(tmp_path_factory):
    """Key pairs made by the CLI (server, client, other) and a clients directory
    holding only client's public certificate."""
    where = tmp_path_factory.mktemp("certs")
    for name in ("server", "client", "other"):
        made = run(["--make-cert", str(where / name)])
        assert made.returncode == 0, made.stderr
    (where / "clients").mkdir()
    shutil.copy(where / "client.key", where / "clients" / "client.key")
    return where


def curve_server(secret_file):
    """A Receiver setup: CURVE server with this key pair (admits any client)."""
    def setup(sock):
        sock.curve_server = True
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(secret_file)
    return setup


def curve_client(secret_file, server_public_file):
    """A Receiver setup: CURVE client with this key pair, trusting this server key."""
    def setup(sock):
        sock.curve_publickey, sock.curve_secretkey = zmq.auth.load_certificate(secret_file)
        sock.curve_serverkey = zmq.auth.load_certificate(server_public_file)[0]
    return setup


def numbered(count: int) -> bytes:
    return b"".join(b"%s-%d\n" % (SECRET_MARK, i) for i in range(count))


def stats_of(stderr: bytes) -> dict:
    """The last --stats line, as a dict of ints (rate left out)."""
    lines = [line for line in unstamped(stderr).decode().splitlines()
             if line.startswith("zmqpush: read=")]
    assert lines, stderr
    return {k: int(v) for k, v in (kv.split("=") for kv in lines[-1][9:].split())
            if k != "rate"}


def said(stderr: bytes, pattern: str) -> int:
    """How many stderr lines match pattern."""
    return len([line for line in unstamped(stderr).decode().splitlines()
                if re.search(pattern, line)])


# -- key pairs ----------------------------------------------------------------------

def test_make_cert_writes_a_key_pair_both_libraries_read_and_never_overwrites(tmp_path):
    made = run(["--make-cert", str(tmp_path / "app")])
    assert made.returncode == 0, made.stderr
    public_file, secret_file = tmp_path / "app.key", tmp_path / "app.key_secret"
    assert oct(secret_file.stat().st_mode & 0o777) == "0o600"
    public, none = zmq.auth.load_certificate(public_file)
    same, secret = zmq.auth.load_certificate(secret_file)
    assert none is None and same == public and zmq.curve_public(secret) == public
    assert f"public key: {public.decode()}" in made.stdout.decode()
    before = secret_file.read_bytes()
    again = run(["--make-cert", str(tmp_path / "app")])
    assert again.returncode == 2 and b"exists (not overwritten)" in again.stderr
    assert secret_file.read_bytes() == before
    ignored = run(["-c", "tcp://127.0.0.1:9", "--linger", "0"],
                  env={"ZMQPUSH_MAKE_CERT": str(tmp_path / "env")})
    assert ignored.returncode == 0 and not list(tmp_path.glob("env*"))


@pytest.mark.parametrize("base", ["", "keys/", "keys/sub/"])
def test_make_cert_with_no_file_name_is_a_usage_error_and_writes_nothing(tmp_path, base):
    """'' or a path ending in '/' would write the hidden files .key and
    .key_secret into that directory (or the current one)."""
    (tmp_path / "keys" / "sub").mkdir(parents=True)
    made = subprocess.run(cli("--make-cert", base), capture_output=True, timeout=60,
                          cwd=tmp_path, env=env_with(None))
    assert made.returncode == 2, made.stderr
    lines = made.stderr.decode().splitlines()
    assert len(lines) == 1 and unstamped(lines[0]).startswith("zmqpush: --make-cert"), lines
    assert made.stdout == b""
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["keys", "sub"]


# -- connecting ---------------------------------------------------------------------

class RecordingProxy:
    """A TCP proxy on 127.0.0.1 (in a thread) to target_port that records every
    byte it forwards, both ways."""

    def __init__(self, target_port: int):
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._target = target_port
        self.data = bytearray()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        peers = {}  # socket -> the socket it forwards to
        while not self._stop.is_set():
            readable = select.select([self._listener, *peers], [], [], 0.05)[0]
            for sock in readable:
                if sock is self._listener:
                    inbound = self._listener.accept()[0]
                    outbound = socket.create_connection(("127.0.0.1", self._target))
                    peers[inbound], peers[outbound] = outbound, inbound
                    continue
                if sock not in peers:
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    data = b""
                if data:
                    self.data += data
                    peers[sock].sendall(data)
                else:
                    other = peers.pop(sock)
                    peers.pop(other, None)
                    sock.close()
                    other.close()
        for sock in [self._listener, *peers]:
            sock.close()

    def stop(self):
        self._stop.set()
        self._thread.join(5)


@pytest.mark.parametrize("curve", [True, False], ids=["curve", "plain-control"])
def test_captured_traffic_holds_no_plaintext_with_curve(certs, curve):
    """With CURVE nothing of a known line crosses the wire in clear; the control
    run without CURVE shows the proxy does see plaintext."""
    receiver = Receiver(free_port(), setup=curve_server(certs / "server.key_secret")
                        if curve else None)
    proxy = RecordingProxy(receiver.port)
    keys = ["--curve-server-cert", str(certs / "server.key"),
            "--curve-cert", str(certs / "client.key_secret")] if curve else []
    try:
        proc = run(["-c", f"tcp://127.0.0.1:{proxy.port}", *keys], numbered(2000))
        assert proc.returncode == 0, proc.stderr
        assert receiver.wait_for(2000) == 2000
        assert receiver.messages() == [f"{SECRET_MARK.decode()}-{i}" for i in range(2000)]
    finally:
        proxy.stop()
        receiver.stop()
    captured = bytes(proxy.data)
    assert len(captured) > len(numbered(2000))
    if curve:
        assert b"hunter2" not in captured and b'"message"' not in captured
        assert b"CURVE" in captured[:64]  # the ZMTP greeting names the mechanism
    else:
        assert SECRET_MARK + b"-1999" in captured


def test_curve_to_a_pyzmq_receiver_with_the_client_key_found_beside_it(certs):
    """--curve-cert may name the public file: NAME_secret beside it is used, as
    czmq's zcert_load does; without --curve-cert a new key pair is made."""
    receiver = Receiver(free_port(), setup=curve_server(certs / "server.key_secret"))
    try:
        for extra in (["--curve-cert", str(certs / "client.key")], []):
            proc = run(["-c", receiver.endpoint, "--curve-server-cert",
                        str(certs / "server.key"), *extra], b"one\ntwo\n")
            assert proc.returncode == 0, proc.stderr
        assert receiver.wait_for(4) == 4
        assert receiver.messages() == ["one", "two", "one", "two"]
    finally:
        receiver.stop()


def test_a_wrong_server_key_delivers_nothing_says_why_keeps_the_lines_and_exits_3(certs):
    receiver = Receiver(free_port(), setup=curve_server(certs / "server.key_secret"))
    try:
        proc = run(["-c", receiver.endpoint, "--curve-server-cert", str(certs / "other.key"),
                    "--curve-cert", str(certs / "client.key_secret"), "--linger", "2",
                    "--stats", "0.5"], numbered(100))
        assert receiver.settle(0.5) == 0
    finally:
        receiver.stop()
    assert proc.returncode == 3, proc.stderr
    assert said(proc.stderr, r"^zmqpush: handshake with tcp://127\.0\.0\.1:\d+ failed "
                r"\(retrying; lines read are kept\): .*--curve-server-cert is not its "
                r"certificate$") == 1
    assert said(proc.stderr, "^zmqpush: 100 messages were not handed to ZeroMQ") == 1
    assert stats_of(proc.stderr)["handshake_failures"] >= 2  # libzmq retried


def test_a_receiver_without_curve_is_said_once_retried_and_then_gets_every_line(certs):
    """CURVE against a plain receiver: said once, lines kept; once a CURVE
    receiver takes its port, every line arrives (zmqpush connects again)."""
    port = free_port()
    plain = Receiver(port)
    proc = start(["-c", f"tcp://127.0.0.1:{port}", "--curve-server-cert",
                  str(certs / "server.key"), "--linger", "20", "--stats", "0.5"])
    curve = None
    try:
        proc.stdin.write(numbered(500))
        proc.stdin.flush()
        time.sleep(3.0)  # several tries
        assert plain.settle(0.2) == 0
        plain.stop()
        time.sleep(0.5)  # its port is free again
        curve = Receiver(port, setup=curve_server(certs / "server.key_secret"))
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert curve.wait_for(500) == 500
        err = proc.stderr.read()
    finally:
        stop_process(proc)
        plain.stop()
        if curve is not None:
            curve.stop()
    assert said(err, r"failed \(retrying; lines read are kept\): the receiver does not "
                r"speak CURVE$") == 1, err
    assert curve.messages() == [f"{SECRET_MARK.decode()}-{i}" for i in range(500)]
    assert stats_of(err)["handshake_failures"] >= 2


@pytest.fixture
def _imczmq_installed():
    if not imczmq_available():
        pytest.skip("rsyslogd or its imczmq module is missing (Debian: rsyslog-czmq)")


@pytest.mark.usefixtures("_imczmq_installed")
def test_curve_to_imczmq_delivers_20k_hostile_lines_exactly(certs, tmp_path):
    """The README's imczmq configuration: a CURVE server in C that admits the
    clients in a directory; the same certificate files on both sides."""
    port = free_port()
    rs = ImczmqRsyslog(tmp_path / "rs", port, tmp_path / "got.txt", "256k",
                       curve=(certs / "server.key", certs / "clients"))
    lines = hostile_lines(20_000)
    proc = None
    try:
        rs.start()
        proc = start(["-c", f"tcp://127.0.0.1:{port}", "--max-line-bytes", "262144",
                      "--memory-bytes", str(128 << 20), "--curve-server-cert",
                      str(certs / "server.key"), "--curve-cert",
                      str(certs / "client.key_secret"), LOGTYPE])
        _, err = proc.communicate(b"\n".join(lines) + b"\n", timeout=120)
        assert proc.returncode == 0, err
        assert wait_until(lambda: len(rs.received()) >= len(lines), 60)
        got = rs.received()
    finally:
        if proc:
            stop_process(proc)
        rs.stop()
    assert got == [expected_json(line, proc.pid) for line in lines]


@pytest.mark.usefixtures("_imczmq_installed")
@pytest.mark.parametrize(("server", "client", "why"), [
    ("other.key", "client.key_secret", "--curve-server-cert is not its certificate"),
    ("server.key", "other.key_secret", r"the receiver refused us \(ZAP status 400\): is our "
     r"public key \S+ among its allowed clients\?"),
], ids=["wrong-server-key", "client-not-on-the-list"])
def test_imczmq_gets_nothing_from_a_wrong_key_and_zmqpush_says_why(
        certs, tmp_path, server, client, why):
    port = free_port()
    rs = ImczmqRsyslog(tmp_path / "rs", port, tmp_path / "got.txt",
                       curve=(certs / "server.key", certs / "clients"))
    try:
        rs.start()
        proc = run(["-c", f"tcp://127.0.0.1:{port}", "--curve-server-cert",
                    str(certs / server), "--curve-cert", str(certs / client), "--linger", "2.5",
                    "--stats", "0.5", LOGTYPE], numbered(300))
        time.sleep(0.5)
        got = rs.received()
    finally:
        rs.stop()
    assert proc.returncode == 3, proc.stderr
    assert got == []
    assert said(proc.stderr, f"failed \\(retrying; lines read are kept\\): .*{why}$") == 1, \
        proc.stderr
    assert said(proc.stderr, "^zmqpush: 300 messages were not handed to ZeroMQ") == 1
    assert stats_of(proc.stderr)["handshake_failures"] >= 2  # tried again


# -- binding ------------------------------------------------------------------------

def pull_from(endpoint: str, setup=None) -> Receiver:
    """A PULL socket connecting to a bound zmqpush (via setup: CURVE, source address)."""
    return Receiver(free_port(), setup=setup, connect=endpoint)


def test_bind_with_curve_admits_the_listed_client_and_refuses_others(certs):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start(["--bind", endpoint, "--curve-cert", str(certs / "server.key_secret"),
                  "--curve-clients", str(certs / "clients"), "--stats", "0.3"])
    listed = pull_from(endpoint, curve_client(certs / "client.key_secret", certs / "server.key"))
    stranger = pull_from(endpoint, curve_client(certs / "other.key_secret",
                                                certs / "server.key"))
    plain = pull_from(endpoint)
    try:
        time.sleep(1.0)
        proc.stdin.write(numbered(1000))
        proc.stdin.flush()
        assert listed.wait_for(1000) == 1000
        assert stranger.settle(0.3) == plain.settle(0.3) == 0
        time.sleep(0.7)  # a --stats line after the last delivery
        proc.stdin.close()
        assert proc.wait(30) == 0
        err = proc.stderr.read()
    finally:
        stop_process(proc)
        for peer in (listed, stranger, plain):
            peer.stop()
    other_key = zmq.auth.load_certificate(certs / "other.key")[0].decode()
    assert said(err, f"^zmqpush: refused a client from 127.0.0.1: its key {re.escape(other_key)}"
                " is not in --curve-clients$") == 1, err
    stats = stats_of(err)
    assert stats["refused"] >= 1 and stats["handshake_failures"] >= 2
    assert stats["connected"] == 1 and stats["disconnects"] == 0 and stats["replayed"] == 0


def test_allow_admits_an_allowed_address_and_refuses_another(certs):
    """127.0.0.2 against --allow 127.0.0.1/32: refused, counted, said once; a raw
    TCP peer from there gets ZeroMQ's greeting and nothing of any line."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start(["--bind", endpoint, "--allow", "127.0.0.1/32", "--stats", "0.3"])
    allowed = pull_from(endpoint)
    refused = pull_from(f"tcp://127.0.0.2:0;{endpoint[6:]}")
    raw = socket.socket()
    try:
        time.sleep(1.0)
        proc.stdin.write(numbered(1000))
        proc.stdin.flush()
        assert allowed.wait_for(1000) == 1000
        raw.bind(("127.0.0.2", 0))
        raw.connect(("127.0.0.1", int(endpoint.rsplit(":", 1)[1])))
        raw.sendall(b"\xff" + b"\0" * 8 + b"\x7f\x03\x00NULL" + b"\0" * 48)
        raw.settimeout(5)
        got_raw = b""
        while len(got_raw) < 1 << 20:
            try:
                chunk = raw.recv(65536)
            except (socket.timeout, ConnectionResetError):
                break
            if not chunk:
                break
            got_raw += chunk
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert refused.settle(0.3) == 0
        err = proc.stderr.read()
    finally:
        raw.close()
        stop_process(proc)
        allowed.stop()
        refused.stop()
    assert allowed.messages() == [f"{SECRET_MARK.decode()}-{i}" for i in range(1000)]
    assert 0 < len(got_raw) < 200 and b"hunter2" not in got_raw
    assert said(err, r"^zmqpush: refused a peer from 127\.0\.0\.2: not in --allow$") == 1, err
    stats = stats_of(err)
    assert stats["refused"] >= 2 and stats["connected"] == 1 and stats["replayed"] == 0


def test_peers_that_drop_during_the_handshake_never_disturb_the_connected_receiver(certs):
    """Hostile probe: 60 peers that connect and close, reset, send garbage or half
    a greeting, against a bound zmqpush with a receiver connected: no disconnect,
    no replay, no duplicate (each once looked like the receiver going away)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    port = int(endpoint.rsplit(":", 1)[1])
    proc = start(["--bind", endpoint, "--allow", "127.0.0.0/8", "--stats", "0.3"])
    receiver = pull_from(endpoint)
    try:
        time.sleep(1.0)
        proc.stdin.write(numbered(500))
        proc.stdin.flush()
        assert receiver.wait_for(500) == 500
        for n in range(60):
            peer = socket.create_connection(("127.0.0.1", port))
            if n % 3 == 1:
                peer.sendall(b"GET / HTTP/1.0\r\n\r\n")
            elif n % 3 == 2:
                peer.sendall(b"\xff" + b"\0" * 8 + b"\x7f\x03")
                peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\1\0\0\0\0\0\0\0")
            peer.close()
        time.sleep(1.0)
        proc.stdin.write(numbered(1000)[len(numbered(500)):])
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert receiver.settle(0.5) == 1000
        err = proc.stderr.read()
    finally:
        stop_process(proc)
        receiver.stop()
    assert receiver.messages() == [f"{SECRET_MARK.decode()}-{i}" for i in range(1000)]
    stats = stats_of(err)
    # libzmq reports no failed handshake for a peer that does not start with
    # ZeroMQ's greeting (the HTTP ones) when ZAP is on: it just drops them.
    assert stats["handshake_failures"] >= 40
    assert stats["connected"] == 1 and stats["disconnects"] == 0 and stats["replayed"] == 0


def test_idle_with_the_zap_handler_the_main_thread_never_wakes(certs):
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    proc = start(["--bind", endpoint, "--allow", "127.0.0.1", "--curve-cert",
                  str(certs / "server.key_secret"), "--curve-clients", str(certs / "clients")])
    receiver = pull_from(endpoint, curve_client(certs / "client.key_secret",
                                                certs / "server.key"))
    try:
        proc.stdin.write(b"one line, then silence\n")
        proc.stdin.flush()
        assert receiver.wait_for(1, 10) == 1
        assert wakeups_once_settled(proc) == 0
        proc.stdin.close()
        assert proc.wait(10) == 0
    finally:
        stop_process(proc)
        receiver.stop()


# -- clear failures -----------------------------------------------------------------

def write(path, text: str):
    path.write_text(text)
    return str(path)


BAD_CERTS = {
    "missing": lambda d: str(d / "nothing-here"),
    "a-directory": str,
    "through-a-file": lambda d: write(d / "file", "x") + "/cert",
    "a-fifo": lambda d: (os.mkfifo(d / "fifo"), str(d / "fifo"))[1],
    "huge": lambda d: write(d / "huge", "#" * (1 << 20)),
    "no-curve-section": lambda d: write(d / "empty", "metadata\n"),
    "short-key": lambda d: write(d / "short", 'curve\n    public-key = "abc"\n'),
    "binary": lambda d: (d / "bin").write_bytes(b"public-key = \xff\x00" * 4) and str(d / "bin"),
    "mismatched-pair": None,  # made below from two real pairs
    # 40 Z85 characters that overflow a 32-bit group: no key, though the alphabet fits
    "undecodable-key": lambda d: write(d / "z85", f'curve\n    public-key = "{"#" * 40}"\n'),
    "key-line-without-equals": lambda d: write(d / "noeq", "curve\n    public-key\n"),
}


@pytest.mark.parametrize("kind", list(BAD_CERTS))
@pytest.mark.parametrize("option", ["--curve-server-cert", "--curve-cert"])
def test_a_bad_certificate_is_one_usage_line_before_anything_is_read(certs, tmp_path,
                                                                     kind, option):
    if kind == "mismatched-pair":
        server = zmq.auth.load_certificate(certs / "server.key_secret")
        other = zmq.auth.load_certificate(certs / "other.key_secret")
        bad = write(tmp_path / "mixed", f'curve\n    public-key = "{server[0].decode()}"\n'
                    f'    secret-key = "{other[1].decode()}"\n')
    else:
        bad = BAD_CERTS[kind](tmp_path)
    good = {"--curve-server-cert": str(certs / "server.key"),
            "--curve-cert": str(certs / "client.key_secret")}
    good[option] = bad
    proc = run(["-c", "tcp://127.0.0.1:9", *[a for kv in good.items() for a in kv]],
               b"never read\n", timeout=20)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert unstamped(lines[0]).startswith(f"zmqpush: {option} "), lines


@pytest.mark.parametrize(("args", "message"), [
    (["--bind", "tcp://127.0.0.1:9", "--curve-cert", "S"], "needs --curve-clients"),
    (["--bind", "tcp://127.0.0.1:9", "--curve-clients", "C"], "needs --curve-cert"),
    (["--bind", "tcp://127.0.0.1:9", "--curve-cert", "S", "--curve-server-cert", "P",
      "--curve-clients", "C"], "--curve-server-cert is for --connect"),
    (["-c", "tcp://127.0.0.1:9", "--curve-cert", "S"], "needs --curve-server-cert"),
    (["-c", "tcp://127.0.0.1:9", "--curve-server-cert", "P", "--curve-clients", "C"],
     "--curve-clients is for --bind"),
    (["-c", "tcp://127.0.0.1:9", "--bind", "tcp://127.0.0.1:9", "--curve-server-cert", "P"],
     "not both"),
    (["-c", "tcp://127.0.0.1:9", "--allow", "127.0.0.1"], "it needs --bind"),
    (["--bind", "ipc:///tmp/zmqpush-allow", "--allow", "127.0.0.1"], "tcp:// endpoints"),
    (["--bind", "tcp://127.0.0.1:9", "--allow", "10.0.0.0/33"], "not an address or network"),
    (["--bind", "tcp://127.0.0.1:9", "--curve-cert", "S", "--curve-clients", "EMPTY"],
     "no certificate in it"),
    (["--bind", "tcp://127.0.0.1:9", "--curve-cert", "S", "--curve-clients", "JUNK"],
     "not a ZPL certificate"),
    (["-c", "tcp://127.0.0.1:9", "--curve-server-cert", "P", "--curve-cert", "PUBLIC_ONLY"],
     "no secret-key in it, and no"),
    # an empty value never turns security off
    (["-c", "tcp://127.0.0.1:9", "--curve-server-cert", ""], "--curve-server-cert is empty"),
    (["--bind", "tcp://127.0.0.1:9", "--curve-cert", "", "--curve-clients", ""],
     "--curve-cert is empty"),
    (["--bind", "tcp://127.0.0.1:9", "--allow", ""], "not an address or network"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_options_that_cannot_work_or_would_admit_anyone_are_refused(certs, tmp_path, args,
                                                                    message):
    (tmp_path / "empty").mkdir()
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "README").write_text("not a certificate\n")
    shutil.copy(certs / "client.key", tmp_path / "public-only.key")
    names = {"S": certs / "server.key_secret", "P": certs / "server.key",
             "C": certs / "clients", "EMPTY": tmp_path / "empty", "JUNK": tmp_path / "junk",
             "PUBLIC_ONLY": tmp_path / "public-only.key"}
    with pytest.raises(zmqpush.UsageError) as refused:
        zmqpush.parse_options([str(names.get(a, a)) for a in args], {})
    assert message in str(refused.value)


def test_a_refused_security_option_is_one_usage_line_before_anything_is_read():
    """What the parsing refuses (above, in this process) the command says in one line
    on stderr, exit 2, reading nothing."""
    proc = run(["--bind", "tcp://127.0.0.1:9", "--allow", ""], b"never read\n", timeout=20)
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert "not an address or network" in lines[0], lines


def test_a_secret_key_open_to_others_is_warned_about_once_and_still_used(certs, tmp_path):
    loose = tmp_path / "loose.key_secret"
    shutil.copy(certs / "client.key_secret", loose)
    loose.chmod(0o644)
    receiver = Receiver(free_port(), setup=curve_server(certs / "server.key_secret"))
    try:
        proc = run(["-c", receiver.endpoint, "--curve-server-cert", str(certs / "server.key"),
                    "--curve-cert", str(loose)], b"still sent\n")
        assert receiver.wait_for(1) == 1
    finally:
        receiver.stop()
    assert proc.returncode == 0, proc.stderr
    assert said(proc.stderr, f"^zmqpush: warning: {re.escape(str(loose))} holds a secret key "
                "and is open to group or others \\(mode 644\\): chmod 600") == 1


def test_security_options_from_the_environment(certs):
    receiver = Receiver(free_port(), setup=curve_server(certs / "server.key_secret"))
    try:
        proc = run([], b"from the environment\n", env={
            "ZMQPUSH_CONNECT": receiver.endpoint,
            "ZMQPUSH_CURVE_SERVER_CERT": str(certs / "server.key"),
            "ZMQPUSH_CURVE_CERT": str(certs / "client.key_secret")})
        assert proc.returncode == 0, proc.stderr
        assert receiver.wait_for(1) == 1
    finally:
        receiver.stop()
    bad = run([], b"", env={"ZMQPUSH_BIND": "tcp://127.0.0.1:9",
                            "ZMQPUSH_ALLOW": "127.0.0.1/32, not-a-network"})
    assert bad.returncode == 2 and b"not-a-network" in bad.stderr



@pytest.mark.parametrize(("name", "value"), [("ZMQPUSH_CURVE_SERVER_CERT", ""),
                                             ("ZMQPUSH_ALLOW", " , ")])
def test_an_empty_environment_twin_never_turns_security_off(name, value):
    args = ["-c", "tcp://127.0.0.1:9"] if "CURVE" in name else ["--bind", "tcp://127.0.0.1:9"]
    proc = run(args, b"never read\n", timeout=20, env={name: value})
    lines = proc.stderr.decode().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, lines)
    assert "is empty" in lines[0], lines


def bound(port: int) -> bool:
    """Whether something accepts connections on 127.0.0.1:port (a peer that connects
    and closes: zmqpush drops it and goes on)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


def test_a_peer_announcing_a_huge_handshake_frame_is_dropped_unbuffered(certs):
    """A refused or keyless peer cannot make zmqpush hold what it sends: a PUSH
    socket only receives handshake commands, and larger frames end the peer."""
    port = free_port()
    proc = start(["--bind", f"tcp://127.0.0.1:{port}", "--allow", "127.0.0.1/32", "-q"])
    try:
        wait_stop_signals_taken(proc)  # started (a loaded machine's start-up takes seconds)
        assert wait_until(lambda: bound(port), 30, 0.05), "zmqpush did not bind"
        before = vm_peak_rss_kib(proc.pid)
        peer = socket.create_connection(("127.0.0.1", port), timeout=5)
        peer.sendall(b"\xff" + b"\x00" * 8 + b"\x7f\x03\x00" + b"NULL".ljust(20, b"\x00")
                     + b"\x00" * 32)
        peer.sendall(b"\x06" + (100 << 20).to_bytes(8, "big"))  # a 100 MiB command frame
        sent = 0
        try:
            for _ in range(100):
                peer.sendall(b"A" * (1 << 20))
                sent += 1
        except OSError:
            pass  # dropped, as it should be
        peer.close()
        time.sleep(0.5)
        assert vm_peak_rss_kib(proc.pid) - before < 16 << 10, (sent, before)
    finally:
        stop_process(proc)
