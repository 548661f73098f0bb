"""A small authenticated TCP key-value store, served by rank 0, that ranks rendezvous through.

Wire format (no pickle): after the handshake in ``auth``, each request is a fixed 21-byte header
``<op u8, key length u32, value length u64, timeout f64>`` followed by the key and the value;
each response is ``<status u8, length u64>`` and a payload. Lengths are checked against hard caps
before anything is allocated; a peer that breaks the format is dropped and the server carries
on serving everyone else. Counters (``add``) are stored as ASCII decimals, as PyTorch does.
"""
from __future__ import annotations

import errno
import selectors
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Callable, Iterable, NamedTuple, Optional, Union

from .auth import client_handshake, job_secret, server_handshake
from .errors import AuthenticationError, CollectiveTimeoutError, RendezvousError

MAX_KEY_BYTES = 4096
DEFAULT_MAX_VALUE_BYTES = 64 << 20
MAX_TIMEOUT_S = 1e7
_REQUEST = struct.Struct("<BIQd")
_RESPONSE = struct.Struct("<BQ")
_LEN = struct.Struct("<I")
SET, GET, ADD, CHECK, DELETE, WAIT = range(1, 7)
_OP_NAMES = {SET: "set", GET: "get", ADD: "add", CHECK: "check", DELETE: "delete_key", WAIT: "wait"}
_OK, _TIMEOUT, _ERROR = 0, 1, 2
_GRACE_S = 10.0  # the server answers "timed out" itself; the socket waits this much longer


class FrameError(ValueError):
    """Bytes on the wire that are not a well-formed store frame."""


class Request(NamedTuple):
    op: int
    key: bytes
    value: bytes
    timeout: float


def encode_keys(keys: Iterable[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(k)) + k for k in keys)


def decode_keys(blob: bytes) -> list[bytes]:
    keys, pos = [], 0
    while pos < len(blob):
        if pos + _LEN.size > len(blob):
            raise FrameError(f"key list truncated at byte {pos} of {len(blob)}")
        (n,) = _LEN.unpack_from(blob, pos)
        pos += _LEN.size
        if n > MAX_KEY_BYTES or pos + n > len(blob):
            raise FrameError(f"key of {n} bytes at byte {pos} of a {len(blob)}-byte key list")
        keys.append(bytes(blob[pos:pos + n]))
        pos += n
    return keys


def encode_request(op: int, key: bytes = b"", value: bytes = b"", timeout: float = 0.0) -> bytes:
    return _REQUEST.pack(op, len(key), len(value), timeout) + key + value


def read_request(read_exact: Callable[[int], bytes],
                 max_value: int = DEFAULT_MAX_VALUE_BYTES) -> Request:
    """Decode one request; ``read_exact(n)`` is only ever asked for a length within the caps.

    Raises FrameError on malformed input (and whatever ``read_exact`` raises on a short read).
    """
    op, key_len, value_len, timeout = _REQUEST.unpack(read_exact(_REQUEST.size))
    if op not in _OP_NAMES:
        raise FrameError(f"unknown store operation {op}")
    if key_len > MAX_KEY_BYTES:
        raise FrameError(f"key of {key_len} bytes exceeds the {MAX_KEY_BYTES}-byte limit")
    if value_len > max_value:
        raise FrameError(f"value of {value_len} bytes exceeds the {max_value}-byte limit")
    if not 0.0 <= timeout <= MAX_TIMEOUT_S:  # also rejects NaN
        raise FrameError(f"timeout {timeout} is outside [0, {MAX_TIMEOUT_S}]")
    key = read_exact(key_len) if key_len else b""
    value = read_exact(value_len) if value_len else b""
    if op in (CHECK, WAIT):
        decode_keys(value)
    elif op == ADD and len(value) != 8:
        raise FrameError(f"add carries an 8-byte amount, got {len(value)} bytes")
    return Request(op, key, value, timeout)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)


def _seconds(timeout: Union[float, timedelta, None], default: float) -> float:
    if timeout is None:
        return default
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not 0.0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT_S}] seconds, got {timeout!r}")
    return value


class _ClientGone(Exception):
    pass


class _Server:
    """Accepts connections in one thread and serves each in its own daemon thread."""

    def __init__(self, listener: socket.socket, secret: bytes, max_value: int,
                 handshake_timeout: float, max_clients: int) -> None:
        self._listener, self._secret, self._max_value = listener, secret, max_value
        self._handshake_timeout, self._max_clients = handshake_timeout, max_clients
        self._data: dict[bytes, bytes] = {}
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake_r, self._wake_w = socket.socketpair()
        self._thread = threading.Thread(target=self._accept_loop, name="store-accept", daemon=True)
        self._thread.start()

    @property
    def num_clients(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def _accept_loop(self) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(self._listener, selectors.EVENT_READ)
            sel.register(self._wake_r, selectors.EVENT_READ)
            while not self._stop.is_set():
                if not any(key.fileobj is self._listener for key, _ in sel.select()):
                    continue
                try:
                    conn, addr = self._listener.accept()
                except OSError:
                    continue
                with self._conns_lock:
                    if len(self._conns) >= self._max_clients:
                        conn.close()
                        continue
                    self._conns.add(conn)
                threading.Thread(target=self._serve, args=(conn,), daemon=True,
                                 name=f"store-conn-{addr}").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            server_handshake(conn, self._secret, self._handshake_timeout)
            conn.settimeout(self._handshake_timeout)  # bound on stalls inside one frame
            with selectors.DefaultSelector() as sel:
                sel.register(conn, selectors.EVENT_READ)
                while not self._stop.is_set():
                    if not sel.select(0.5):
                        continue
                    req = read_request(lambda n: _recv_exact(conn, n), self._max_value)
                    status, payload = self._execute(req, conn)
                    conn.sendall(_RESPONSE.pack(status, len(payload)) + payload)
        except (AuthenticationError, FrameError, EOFError, OSError, _ClientGone):
            pass  # drop this peer; the others are unaffected
        finally:
            with self._conns_lock:
                self._conns.discard(conn)
            conn.close()

    def _execute(self, req: Request, conn: socket.socket) -> tuple[int, bytes]:
        with self._cond:
            if req.op == SET:
                self._data[req.key] = req.value
                self._cond.notify_all()
            elif req.op == ADD:
                try:
                    current = int(self._data.get(req.key, b"0"))
                except ValueError:
                    return _ERROR, f"value of key {req.key!r} is not an integer".encode()
                total = current + struct.unpack("<q", req.value)[0]
                self._data[req.key] = str(total).encode()
                self._cond.notify_all()
                return _OK, str(total).encode()
            elif req.op == CHECK:
                return _OK, bytes([all(k in self._data for k in decode_keys(req.value))])
            elif req.op == DELETE:
                return _OK, bytes([self._data.pop(req.key, None) is not None])
            else:  # GET and WAIT block until their keys exist
                keys = [req.key] if req.op == GET else decode_keys(req.value)
                deadline = time.monotonic() + req.timeout
                while not all(k in self._data for k in keys):
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return _TIMEOUT, b""
                    self._cond.wait(min(remaining, 0.5))
                    if self._stop.is_set() or _disconnected(conn):
                        raise _ClientGone()
                if req.op == GET:
                    return _OK, self._data[req.key]
        return _OK, b""

    def close(self) -> None:
        self._stop.set()
        self._wake_w.send(b"x")
        self._thread.join(timeout=5.0)
        self._listener.close()
        with self._conns_lock:
            for conn in self._conns:
                try:
                    conn.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
        with self._cond:
            self._cond.notify_all()
        self._wake_r.close()
        self._wake_w.close()


def _disconnected(conn: socket.socket) -> bool:
    """True when the client hung up (EOF or reset) while we held its request."""
    with selectors.DefaultSelector() as sel:
        sel.register(conn, selectors.EVENT_READ)
        if not sel.select(0):
            return False
    try:
        return conn.recv(1, socket.MSG_PEEK) == b""
    except OSError:
        return True


def _is_loopback(host: str) -> bool:
    return host in ("localhost", "::1") or host.startswith("127.")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Non-loopback names may resolve to 127.0.1.1 locally; listening everywhere avoids that trap.
    bind_host = host if _is_loopback(host) else ("::" if family == socket.AF_INET6 else "")
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((bind_host, port))
        sock.listen(1024)
    except OSError as e:
        sock.close()
        hint = " (port in use; pick another MASTER_PORT)" if e.errno == errno.EADDRINUSE else ""
        raise RendezvousError(f"store server cannot listen on {host}:{port}: "
                              f"{e.strerror or e}{hint}") from None
    return sock


class TCPStore:
    """Key-value store for rendezvous; rank 0 passes ``is_server=True`` and serves it.

    Every rank, the server's own included, talks to the server over an authenticated socket.
    ``port=0`` on the server picks a free port (read ``.port``). Clients retry connecting
    until ``timeout``, since the server may start after them.
    """

    def __init__(self, host: str, port: int, world_size: Optional[int] = None,
                 is_server: bool = False, secret: Optional[bytes] = None,
                 timeout: Union[float, timedelta] = 300.0, *,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535 or (port == 0 and not is_server):
            raise ValueError(f"store port must be an int in [1, 65535] (0 only for the server), "
                             f"got {port!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive int or None, got {world_size!r}")
        self.host, self.world_size, self.is_server = host, world_size, is_server
        self.timeout = _seconds(timeout, 300.0)
        self._secret = job_secret() if secret is None else bytes(secret)
        self._max_value = max_value_bytes
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._server: Optional[_Server] = None
        if is_server:
            listener = _listen(host, port)
            port = listener.getsockname()[1]
            clients = max(256, 4 * (world_size or 1))
            self._server = _Server(listener, self._secret, max_value_bytes,
                                   min(self.timeout, 30.0), clients)
        self.port = port
        try:
            self._connect(self.timeout)
        except BaseException:
            self.close()
            raise

    @property
    def local_address(self) -> str:
        """The address this process uses to reach the store (routable from the other ranks)."""
        with self._lock:
            if self._sock is None:
                self._connect(self.timeout)
            return self._sock.getsockname()[0]

    @property
    def num_clients(self) -> int:
        """Connections the server holds now (server side only)."""
        if self._server is None:
            raise RuntimeError("num_clients is only known on the store's server")
        return self._server.num_clients

    def _connect(self, timeout: float) -> None:
        start = time.monotonic()
        delay, last_error = 0.01, "no attempt made"
        while True:
            remaining = timeout - (time.monotonic() - start)
            if remaining <= 0:
                raise RendezvousError(
                    f"could not reach the store at {self.host}:{self.port} after waiting "
                    f"{timeout:.1f} s (last error: {last_error}); is rank 0 running and "
                    "MASTER_ADDR/MASTER_PORT the same on every rank?")
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(remaining, 5))
            except OSError as e:
                last_error = str(e)
                time.sleep(min(delay, max(remaining, 0)))
                delay = min(delay * 2, 0.5)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client_handshake(sock, self._secret, min(remaining, 30.0))
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            return

    def _call(self, op: int, label: str, raw_key: bytes, value: bytes = b"",
              wait_s: float = 0.0) -> bytes:
        what = f"store {_OP_NAMES[op]}({label!r})"
        with self._lock:
            if self._sock is None:
                try:
                    self._connect(self.timeout)
                except RendezvousError as e:
                    raise RendezvousError(f"{what}: {e}", op=f"store.{_OP_NAMES[op]}") from None
            sock = self._sock
            try:
                sock.settimeout(wait_s + _GRACE_S if op in (GET, WAIT) else self.timeout)
                sock.sendall(encode_request(op, raw_key, value, wait_s))
                status, length = _RESPONSE.unpack(_recv_exact(sock, _RESPONSE.size))
                if length > self._max_value:
                    raise EOFError(f"response of {length} bytes exceeds the limit")
                payload = _recv_exact(sock, length) if length else b""
            except socket.timeout:
                self._drop_connection()
                raise CollectiveTimeoutError(f"{what} got no answer from {self.host}:"
                                             f"{self.port} in {sock.gettimeout():.1f} s",
                                             op=f"store.{_OP_NAMES[op]}") from None
            except (OSError, EOFError) as e:
                self._drop_connection()
                raise RendezvousError(f"{what} failed: the store at {self.host}:{self.port} "
                                      f"went away ({e})", op=f"store.{_OP_NAMES[op]}") from None
        if status == _TIMEOUT:
            raise CollectiveTimeoutError(f"{what} timed out after {wait_s:.1f} s waiting for "
                                         "the key(s) to be set", op=f"store.{_OP_NAMES[op]}")
        if status == _ERROR:
            raise ValueError(f"{what}: {payload.decode(errors='replace')}")
        return payload

    def _drop_connection(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def set(self, key: str, value: Union[bytes, bytearray, memoryview, str]) -> None:
        self._call(SET, key, _encode_key(key), self._encode_value(key, value))

    def get(self, key: str, timeout: Union[float, timedelta, None] = None) -> bytes:
        """The value of ``key``, waiting until some rank sets it."""
        return self._call(GET, key, _encode_key(key), wait_s=_seconds(timeout, self.timeout))

    def wait(self, keys: Union[str, Iterable[str]],
             timeout: Union[float, timedelta, None] = None) -> None:
        keys = [keys] if isinstance(keys, str) else list(keys)
        self._call(WAIT, ",".join(keys), b"", encode_keys(map(_encode_key, keys)),
                   wait_s=_seconds(timeout, self.timeout))

    def add(self, key: str, amount: int) -> int:
        """Atomically add ``amount`` to the counter at ``key`` (0 if absent); returns the sum."""
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise TypeError(f"add amount must be an int, got {type(amount).__name__}")
        if not -(1 << 63) <= amount < (1 << 63):
            raise ValueError(f"add amount {amount} does not fit in 64 bits")
        return int(self._call(ADD, key, _encode_key(key), struct.pack("<q", amount)))

    def check(self, keys: Union[str, Iterable[str]]) -> bool:
        keys = [keys] if isinstance(keys, str) else list(keys)
        blob = encode_keys(map(_encode_key, keys))
        return self._call(CHECK, ",".join(keys), b"", blob) == b"\x01"

    def delete_key(self, key: str) -> bool:
        return self._call(DELETE, key, _encode_key(key)) == b"\x01"

    def _encode_value(self, key: str, value) -> bytes:
        if isinstance(value, str):
            value = value.encode()
        if not isinstance(value, (bytes, bytearray, memoryview)):
            raise TypeError(f"store value for {key!r} must be bytes, got {type(value).__name__}")
        value = bytes(value)
        if len(value) > self._max_value:
            raise ValueError(f"store value for {key!r} is {len(value)} bytes; the limit is "
                             f"{self._max_value}")
        return value

    def close(self) -> None:
        """Disconnect; on the server this also stops serving. Safe to call twice."""
        with self._lock:
            self._drop_connection()
        if self._server is not None:
            self._server.close()
            self._server = None

    def __enter__(self) -> "TCPStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _encode_key(key: str) -> bytes:
    if not isinstance(key, str):
        raise TypeError(f"store keys are str, got {type(key).__name__} {key!r}")
    raw = key.encode()
    if not raw or len(raw) > MAX_KEY_BYTES:
        raise ValueError(f"store key must be 1..{MAX_KEY_BYTES} bytes, got {len(raw)} bytes "
                         f"({key[:40]!r})")
    return raw


def barrier(store: TCPStore, key_prefix: str, world_size: int, rank: int,
            timeout: Union[float, timedelta, None] = None) -> None:
    """Block until ``world_size`` ranks reach it; use a fresh ``key_prefix`` for each barrier."""
    if not 0 <= rank < world_size:
        raise ValueError(f"barrier rank {rank} outside [0, {world_size})")
    store.set(f"{key_prefix}/arrived/{rank}", b"1")
    if store.add(f"{key_prefix}/count", 1) == world_size:
        store.set(f"{key_prefix}/done", b"1")
    try:
        store.wait([f"{key_prefix}/done"], timeout)
    except CollectiveTimeoutError:
        missing = [r for r in range(world_size)
                   if not store.check([f"{key_prefix}/arrived/{r}"])]
        raise CollectiveTimeoutError(f"barrier {key_prefix!r} timed out; ranks {missing} never "
                                     "arrived", rank=rank, op="store.barrier") from None
