"""Job secret (environment and per-user cookie file) and the mutual HMAC handshake."""
import hashlib
import hmac
import multiprocessing as mp
import os
import socket
import stat
import struct
import threading

import pytest

from neural_arch.distributed.errors import AuthenticationError
from neural_arch.distributed.rendezvous import auth
from neural_arch.distributed.rendezvous.auth import client_handshake, job_secret, server_handshake

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    return tmp_path


def test_secret_from_environment_wins(home, monkeypatch):
    monkeypatch.setenv(auth.SECRET_ENV, "correct horse battery staple")
    assert job_secret() == b"correct horse battery staple"
    assert not (home / ".neural_arch").exists()


def test_cookie_file_created_private_and_stable(home):
    first = job_secret()
    path = home / ".neural_arch" / "secret"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(first) == 64 and bytes.fromhex(first.decode())  # 32 random bytes, hex
    assert job_secret() == first == path.read_bytes().strip()
    assert [p.name for p in path.parent.iterdir()] == ["secret"]  # no temporary left behind


def _read_secret(home_dir, barrier, out):
    os.environ["HOME"] = home_dir
    os.environ.pop(auth.SECRET_ENV, None)
    barrier.wait(timeout=30)
    out.put(job_secret())


def test_concurrent_first_use_agrees(home):
    ctx = mp.get_context("spawn")
    n = 6
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_read_secret, args=(str(home), barrier, out)) for _ in range(n)]
    try:
        for p in procs:
            p.start()
        secrets = {out.get(timeout=45) for _ in procs}
    finally:
        for p in procs:
            p.kill()
            p.join(10)
    assert secrets == {(home / ".neural_arch" / "secret").read_bytes().strip()}


def test_group_readable_cookie_is_refused(home):
    path = home / ".neural_arch" / "secret"
    path.parent.mkdir(mode=0o700)
    path.write_text("abc\n")
    path.chmod(0o640)
    with pytest.raises(AuthenticationError, match="chmod 600"):
        job_secret()


def _pair():
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    listener.close()
    return server, client


def _run_server(sock, secret, result, timeout=5.0):
    try:
        result["info"] = server_handshake(sock, secret, timeout)
    except Exception as e:  # recorded for the assertion in the main thread
        result["error"] = e


def test_handshake_succeeds_and_carries_client_info():
    server, client = _pair()
    result = {}
    t = threading.Thread(target=_run_server, args=(server, b"k3y", result))
    t.start()
    client_handshake(client, b"k3y", 5.0, client_info=b"rank=3")
    t.join(10)
    assert result == {"info": b"rank=3"}
    server.close(), client.close()


def test_wrong_secret_fails_on_both_sides_naming_peer():
    server, client = _pair()
    result = {}
    t = threading.Thread(target=_run_server, args=(server, b"right", result))
    t.start()
    with pytest.raises(AuthenticationError, match="does not know the job secret") as err:
        client_handshake(client, b"wrong", 5.0)
    client.close()  # the client gives up before proving anything; the server sees it leave
    t.join(10)
    assert "127.0.0.1" in str(err.value)
    assert isinstance(result["error"], AuthenticationError)
    assert "127.0.0.1" in str(result["error"])
    server.close()


def test_reflected_server_proof_is_rejected():
    """A client without the secret replays the server's own proof as its answer."""
    server, client = _pair()
    result = {}
    t = threading.Thread(target=_run_server, args=(server, b"s", result))
    t.start()
    nonce = os.urandom(32)
    client.sendall(b"NFa1" + nonce)
    reply = client.recv(4 + 32 + 32, socket.MSG_WAITALL)
    server_nonce, server_proof = reply[4:36], reply[36:]
    expected = hmac.new(b"s", b"neural_arch/server" + nonce + server_nonce, hashlib.sha256)
    assert server_proof == expected.digest()  # the server proved itself correctly
    client.sendall(server_proof + struct.pack("<H", 0))
    t.join(10)
    assert isinstance(result.get("error"), AuthenticationError)
    server.close()  # what every caller does on AuthenticationError
    client.settimeout(5)
    assert client.recv(4) == b""  # no acceptance was ever sent
    client.close()


def test_garbage_and_silence_and_oversized_info_are_rejected():
    for payload, match in ((b"\x80\x04\x95 pickle....." * 3, "does not speak"),
                           (b"", "sent no hello"),
                           (None, "limit")):
        server, client = _pair()
        result = {}
        t = threading.Thread(target=_run_server, args=(server, b"s", result, 0.5))
        t.start()
        if payload is None:  # a proper hello, then an info length far over the limit
            client.sendall(b"NFa1" + os.urandom(32))
            client.recv(68, socket.MSG_WAITALL)
            client.sendall(b"\0" * 32 + struct.pack("<H", 60000))
        else:
            client.sendall(payload)
        t.join(10)
        assert isinstance(result.get("error"), AuthenticationError), payload
        assert match in str(result["error"])
        server.close(), client.close()


def test_client_info_limit_is_checked_before_sending():
    server, client = _pair()
    with pytest.raises(ValueError, match="1025 bytes"):
        client_handshake(client, b"s", 1.0, client_info=b"x" * 1025)
    server.close(), client.close()


def test_unwritable_home_asks_for_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.delenv(auth.SECRET_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "file-not-dir"))
    (tmp_path / "file-not-dir").write_text("a file where a directory should be")
    with pytest.raises(AuthenticationError, match=f"set {auth.SECRET_ENV}"):
        job_secret()
