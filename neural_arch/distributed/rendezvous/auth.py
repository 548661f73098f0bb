"""The mutual HMAC challenge-response every connection starts with (the secret: ``secret.py``).

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
import secrets
import selectors
import socket
import struct
import time
from typing import Optional

from ..errors import AuthenticationError
from .job import labelled_nonce, nonce_label
# the secret's names, where the transports and the store have always imported them
from .secret import (MIN_SECRET_BYTES, SECRET_ENV, check_secret,  # noqa: F401
                     job_secret, secret_file)

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
