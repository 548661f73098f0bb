"""The job secret, and the mutual HMAC challenge-response every connection starts with.

Both ends send a fresh 32-byte nonce and prove knowledge of the secret with an HMAC-SHA256 over
both nonces and a role label, so a response reflected back at its sender never verifies. Before
the proof checks out only fixed-size fields are read: a stranger cannot make us allocate, parse
or unpickle anything.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
import time
from pathlib import Path

from ..errors import AuthenticationError

SECRET_ENV = "NEURAL_ARCH_SECRET"
NONCE_SIZE = 32
MAC_SIZE = 32
MAX_CLIENT_INFO = 1024

_HELLO_MAGIC = b"NFa1"
_ACCEPT = b"NFok"
_INFO_LEN = struct.Struct("<H")
_SERVER_ROLE = b"neural_arch/server"
_CLIENT_ROLE = b"neural_arch/client"


def secret_file() -> Path:
    return Path.home() / ".neural_arch" / "secret"


def job_secret() -> bytes:
    """The job's shared secret: ``$NEURAL_ARCH_SECRET`` if set, else the per-user cookie file."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return from_env.encode()
    path = secret_file()
    try:
        return _read_or_create_cookie(path)
    except OSError as e:
        raise AuthenticationError(f"cannot use secret file {path} ({e}); set {SECRET_ENV} to "
                                  "the same value on every rank instead") from None


def _read_or_create_cookie(path: Path) -> bytes:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not path.exists():
        _create_cookie_atomically(path)
    deadline = time.monotonic() + 5.0
    while True:
        _check_private(path)
        value = path.read_bytes().strip()
        if value:
            return value
        if time.monotonic() > deadline:  # an O_EXCL creator that died before writing
            raise AuthenticationError(f"secret file {path} is empty; delete it or set "
                                      f"{SECRET_ENV}")
        time.sleep(0.01)


def _create_cookie_atomically(path: Path) -> None:
    """Write a temporary file, then hard-link it into place: whoever links first wins, and
    nobody ever reads a half-written cookie."""
    cookie = secrets.token_hex(32).encode() + b"\n"
    tmp = path.with_name(f".secret.{os.getpid()}.{secrets.token_hex(4)}")
    _write_exclusive(tmp, cookie)
    try:
        os.link(tmp, path)
    except FileExistsError:
        pass
    except OSError:  # no hard links here: plain O_EXCL; readers wait until the content lands
        try:
            _write_exclusive(path, cookie)
        except FileExistsError:
            pass
    finally:
        tmp.unlink(missing_ok=True)


def _write_exclusive(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _check_private(path: Path) -> None:
    info = path.stat()
    if info.st_mode & 0o077:
        raise AuthenticationError(
            f"secret file {path} has mode {stat.filemode(info.st_mode)} and can be read by other "
            f"users; run 'chmod 600 {path}' or set {SECRET_ENV}")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise AuthenticationError(f"secret file {path} belongs to uid {info.st_uid}, not to "
                                  f"uid {os.getuid()}; remove it or set {SECRET_ENV}")


def _mac(secret: bytes, role: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, role + b"".join(parts), hashlib.sha256).digest()


def _peer_name(sock: socket.socket) -> str:
    try:
        return str(sock.getpeername())
    except OSError:
        return "<disconnected peer>"


def _recv_exact(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            raise AuthenticationError(f"{_peer_name(sock)} sent no {what} in time") from None
        except OSError as e:
            raise AuthenticationError(f"{_peer_name(sock)} failed during {what}: {e}") from None
        if k == 0:
            raise AuthenticationError(f"{_peer_name(sock)} closed the connection during {what}")
        got += k
    return bytes(buf)


def _send(sock: socket.socket, data: bytes, what: str) -> None:
    try:
        sock.sendall(data)
    except OSError as e:
        raise AuthenticationError(f"could not send {what} to {_peer_name(sock)}: {e}") from None


def server_handshake(sock: socket.socket, secret: bytes, timeout: float) -> bytes:
    """Authenticate the connecting side; returns the ``client_info`` it proved along the way."""
    saved = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        magic = _recv_exact(sock, len(_HELLO_MAGIC), "hello")
        if not hmac.compare_digest(magic, _HELLO_MAGIC):  # drop garbage before reading more
            raise AuthenticationError(f"{_peer_name(sock)} does not speak this protocol "
                                      f"(first bytes {magic!r})")
        client_nonce = _recv_exact(sock, NONCE_SIZE, "hello")
        server_nonce = secrets.token_bytes(NONCE_SIZE)
        proof = _mac(secret, _SERVER_ROLE, client_nonce, server_nonce)
        _send(sock, _HELLO_MAGIC + server_nonce + proof, "challenge")
        answer = _recv_exact(sock, MAC_SIZE + _INFO_LEN.size, "proof")
        (info_len,) = _INFO_LEN.unpack(answer[MAC_SIZE:])
        if info_len > MAX_CLIENT_INFO:
            raise AuthenticationError(f"{_peer_name(sock)} announced {info_len} bytes of client "
                                      f"info (limit {MAX_CLIENT_INFO})")
        info = _recv_exact(sock, info_len, "client info") if info_len else b""
        expected = _mac(secret, _CLIENT_ROLE, client_nonce, server_nonce, answer[MAC_SIZE:], info)
        if not hmac.compare_digest(answer[:MAC_SIZE], expected):
            raise AuthenticationError(f"{_peer_name(sock)} does not know the job secret "
                                      f"(check {SECRET_ENV} on every node)")
        _send(sock, _ACCEPT, "acceptance")
        return info
    finally:
        _restore_timeout(sock, saved)


def client_handshake(sock: socket.socket, secret: bytes, timeout: float,
                     client_info: bytes = b"") -> None:
    """Authenticate the accepting side and prove ourselves, carrying ``client_info``."""
    if len(client_info) > MAX_CLIENT_INFO:
        raise ValueError(f"client_info is {len(client_info)} bytes; limit {MAX_CLIENT_INFO}")
    saved = sock.gettimeout()
    sock.settimeout(timeout)
    try:
        client_nonce = secrets.token_bytes(NONCE_SIZE)
        _send(sock, _HELLO_MAGIC + client_nonce, "hello")
        reply = _recv_exact(sock, len(_HELLO_MAGIC) + NONCE_SIZE + MAC_SIZE, "challenge")
        if not hmac.compare_digest(reply[:4], _HELLO_MAGIC):
            raise AuthenticationError(f"{_peer_name(sock)} does not speak this protocol "
                                      f"(first bytes {reply[:4]!r})")
        server_nonce, proof = reply[4:4 + NONCE_SIZE], reply[4 + NONCE_SIZE:]
        if not hmac.compare_digest(proof, _mac(secret, _SERVER_ROLE, client_nonce, server_nonce)):
            raise AuthenticationError(f"{_peer_name(sock)} does not know the job secret "
                                      f"(check {SECRET_ENV} on every node)")
        length = _INFO_LEN.pack(len(client_info))
        mac = _mac(secret, _CLIENT_ROLE, client_nonce, server_nonce, length, client_info)
        _send(sock, mac + length + client_info, "proof")
        if not hmac.compare_digest(_recv_exact(sock, len(_ACCEPT), "acceptance"), _ACCEPT):
            raise AuthenticationError(f"{_peer_name(sock)} did not accept our proof")
    finally:
        _restore_timeout(sock, saved)


def _restore_timeout(sock: socket.socket, saved) -> None:
    try:
        sock.settimeout(saved)
    except OSError:
        pass
