"""The job secret, and the mutual HMAC challenge-response every connection starts with.

Both ends send a fresh 32-byte nonce and prove knowledge of the secret with an HMAC-SHA256 over
both nonces and a role label, so a response reflected back at its sender never verifies. Before
the proof checks out only fixed-size fields are read: a stranger cannot make us allocate, parse
or unpickle anything. The accepting side is a state machine (``ServerHandshake``) that one
thread can drive for many connections at once; ``server_handshake`` drives one to the end.

A server may start its nonce with a label, its job's name (``job.labelled_nonce``): the
client reads it whether or not the proof checks out, so a rank that reached another job's
server can name that job even when it has another secret.

A connection that fails underneath the handshake (reset, refused, closed by the server) is a
``ConnectionError`` naming the address, not an ``AuthenticationError``: only a wrong proof or
a peer that does not speak the protocol is a question of the secret; a server that says nothing
in time is a ``SilentPeerError`` (busy, stopped or ending: the store's clients try again).
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import selectors
import socket
import stat
import struct
import time
from pathlib import Path
from typing import Optional

from ..errors import AuthenticationError
from .job import labelled_nonce, nonce_label

SECRET_ENV = "NEURAL_ARCH_SECRET"
MIN_SECRET_BYTES = 16  # below this a secret can be guessed; generated ones have 32 or more
NONCE_SIZE = 32
MAC_SIZE = 32
MAX_CLIENT_INFO = 1024

_HELLO_MAGIC = b"NFa1"
_ACCEPT = b"NFok"
_INFO_LEN = struct.Struct("<H")
_SERVER_ROLE = b"neural_arch/server"
_CLIENT_ROLE = b"neural_arch/client"


class SilentPeerError(AuthenticationError):
    """The accepting side sent nothing in time during the handshake."""


def secret_file() -> Path:
    return Path.home() / ".neural_arch" / "secret"


def check_secret(secret, source: str = "the job secret") -> bytes:
    """``secret`` as bytes; a ValueError when it is too short to keep strangers out."""
    if not isinstance(secret, (bytes, bytearray, memoryview)):
        raise TypeError(f"{source} must be bytes, got {type(secret).__name__}")
    secret = bytes(secret)
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"{source} is {len(secret)} byte(s) long; a job secret needs at least "
                         f"{MIN_SECRET_BYTES} bytes (e.g. python -c 'import secrets; "
                         f"print(secrets.token_hex(16))')")
    return secret


def job_secret() -> bytes:
    """The job's shared secret: ``$NEURAL_ARCH_SECRET`` if set, else the per-user cookie file."""
    from_env = os.environ.get(SECRET_ENV)
    if from_env:
        return check_secret(from_env.encode(), SECRET_ENV)
    path = secret_file()
    try:
        cookie = _read_or_create_cookie(path)
    except OSError as e:
        raise AuthenticationError(f"cannot use secret file {path} ({e}); set {SECRET_ENV} to "
                                  "the same value on every rank instead") from None
    return check_secret(cookie, f"secret file {path}")


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


def _connection_error(peer: str, what: str, error: OSError) -> ConnectionError:
    """The connection under a handshake failed: said as such, with the address and the step,
    keeping the kind (a reset stays a ConnectionResetError)."""
    kind = type(error) if isinstance(error, ConnectionError) else ConnectionError
    message = f"connection with {peer} failed during {what}: {error.strerror or error}"
    return kind(message) if error.errno is None else kind(error.errno, message)


def _recv_exact(sock: socket.socket, n: int, what: str, peer: str) -> bytes:
    """Client side: ``n`` bytes; the server hanging up is a connection failure, since it learns
    nothing about our secret before we have checked its proof."""
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        try:
            k = sock.recv_into(view[got:])
        except socket.timeout:
            raise SilentPeerError(f"{peer} sent no {what} in time") from None
        except OSError as e:
            raise _connection_error(peer, what, e) from None
        if k == 0:
            raise ConnectionError(f"{peer} closed the connection during {what}")
        got += k
    return bytes(buf)


def _send(sock: socket.socket, data: bytes, what: str, peer: str) -> None:
    try:
        sock.sendall(data)
    except OSError as e:
        raise _connection_error(peer, what, e) from None


class ServerHandshake:
    """The accepting side of the handshake on a non-blocking socket, advanced by ``step`` each
    time the socket is readable, so one thread can authenticate any number of connections.
    Once the client has proved the secret, ``accept`` tells it so: the owner takes the
    connection in first, so a client that was told it is in is already counted.

    Reads are sized by the protocol (the magic alone first, so garbage is dropped after four
    bytes); the two answers (72 bytes) always fit in a fresh socket's send buffer."""

    def __init__(self, sock: socket.socket, secret: bytes, label: bytes = b"") -> None:
        self.peer = _peer_name(sock)  # taken now: after a reset the address is gone
        self._sock, self._secret, self._label = sock, secret, label
        self.awaiting = "hello"
        self._buf, self._want = bytearray(), len(_HELLO_MAGIC)
        self._client_nonce = self._server_nonce = self._answer = b""
        self._info: Optional[bytes] = None

    def step(self) -> Optional[bytes]:
        """Read what has arrived and answer it: the client's info once it proved the secret,
        None while more is to come. Raises AuthenticationError, or OSError when the
        connection failed."""
        while self._info is None:
            while len(self._buf) < self._want:
                try:
                    k = self._sock.recv(self._want - len(self._buf))
                except BlockingIOError:
                    return None
                except OSError as e:
                    raise _connection_error(self.peer, self.awaiting, e) from None
                if not k:
                    raise AuthenticationError(f"{self.peer} closed the connection during "
                                              f"{self.awaiting}")
                self._buf += k
            self._advance(bytes(self._buf))
        return self._info

    def accept(self) -> None:
        """Send the acceptance the client waits for (after ``step`` returned its info)."""
        if self._info is None:
            raise RuntimeError(f"{self.peer} has not proved the job secret")
        self._answer_with(_ACCEPT, "acceptance")

    def expired(self) -> AuthenticationError:
        """The error for a connection whose deadline passed before it proved the secret."""
        return AuthenticationError(f"{self.peer} sent no {self.awaiting} in time")

    def _advance(self, data: bytes) -> None:
        if self.awaiting == "hello" and len(data) == len(_HELLO_MAGIC):
            if not hmac.compare_digest(data, _HELLO_MAGIC):  # drop garbage before reading more
                raise AuthenticationError(f"{self.peer} does not speak this protocol "
                                          f"(first bytes {data!r})")
            self._want += NONCE_SIZE
        elif self.awaiting == "hello":
            self._client_nonce = data[len(_HELLO_MAGIC):]
            self._server_nonce = labelled_nonce(self._label)
            proof = _mac(self._secret, _SERVER_ROLE, self._client_nonce, self._server_nonce)
            self._answer_with(_HELLO_MAGIC + self._server_nonce + proof, "challenge")
            self._expect("proof", MAC_SIZE + _INFO_LEN.size)
        elif self.awaiting == "proof":
            (info_len,) = _INFO_LEN.unpack(data[MAC_SIZE:])
            if info_len > MAX_CLIENT_INFO:
                raise AuthenticationError(f"{self.peer} announced {info_len} bytes of client "
                                          f"info (limit {MAX_CLIENT_INFO})")
            self._answer = data
            self._expect("client info", info_len)
        else:
            expected = _mac(self._secret, _CLIENT_ROLE, self._client_nonce, self._server_nonce,
                            self._answer[MAC_SIZE:], data)
            if not hmac.compare_digest(self._answer[:MAC_SIZE], expected):
                raise AuthenticationError(f"{self.peer} does not know the job secret "
                                          f"(check {SECRET_ENV} on every node)")
            self._info = data

    def _expect(self, what: str, size: int) -> None:
        self.awaiting, self._buf, self._want = what, bytearray(), size

    def _answer_with(self, data: bytes, what: str) -> None:
        try:
            sent = self._sock.send(data)
        except BlockingIOError:
            sent = 0
        except OSError as e:
            raise _connection_error(self.peer, what, e) from None
        if sent != len(data):
            raise AuthenticationError(f"{self.peer} does not read what it is sent (its "
                                      f"{what} did not fit)")


def server_handshake(sock: socket.socket, secret: bytes, timeout: float) -> bytes:
    """Authenticate the connecting side within ``timeout`` seconds in all; returns the
    ``client_info`` it proved along the way."""
    saved = sock.gettimeout()
    shake = ServerHandshake(sock, secret)
    deadline = time.monotonic() + timeout
    sock.setblocking(False)
    try:
        with selectors.DefaultSelector() as sel:
            sel.register(sock, selectors.EVENT_READ)
            while (info := shake.step()) is None:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sel.select(remaining):
                    raise shake.expired()
            shake.accept()
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
    peer = _peer_name(sock)  # taken now: after a reset the address is gone
    try:
        client_nonce = secrets.token_bytes(NONCE_SIZE)
        _send(sock, _HELLO_MAGIC + client_nonce, "hello", peer)
        reply = _recv_exact(sock, len(_HELLO_MAGIC) + NONCE_SIZE + MAC_SIZE, "challenge", peer)
        if not hmac.compare_digest(reply[:4], _HELLO_MAGIC):
            raise AuthenticationError(f"{peer} does not speak this protocol "
                                      f"(first bytes {reply[:4]!r})")
        server_nonce, proof = reply[4:4 + NONCE_SIZE], reply[4 + NONCE_SIZE:]
        if not hmac.compare_digest(proof, _mac(secret, _SERVER_ROLE, client_nonce, server_nonce)):
            label = nonce_label(server_nonce)
            error = AuthenticationError(
                f"{peer} does not know the job secret (check {SECRET_ENV} on every node)"
                + (f"; it says it serves job {label!r}" if label else ""))
            error.peer_label = label  # for a caller that knows its own job (``TCPStore``)
            raise error
        length = _INFO_LEN.pack(len(client_info))
        mac = _mac(secret, _CLIENT_ROLE, client_nonce, server_nonce, length, client_info)
        _send(sock, mac + length + client_info, "proof", peer)
        if not hmac.compare_digest(_recv_exact(sock, len(_ACCEPT), "acceptance", peer), _ACCEPT):
            raise AuthenticationError(f"{peer} did not accept our proof")
    finally:
        _restore_timeout(sock, saved)


def _restore_timeout(sock: socket.socket, saved) -> None:
    try:
        sock.settimeout(saved)
    except OSError:
        pass
