"""A small authenticated TCP key-value store, served by rank 0, that ranks rendezvous through.

This module holds the client every rank uses (``TCPStore``); the wire format is in
``store_protocol``, the server in ``store_server``, ``barrier`` and ``claim_rank`` in
``arrival``. Their public names are importable from here too.
"""
from __future__ import annotations

import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Iterable, Optional, Union

from ..errors import AuthenticationError, CollectiveTimeoutError, RendezvousError
from .arrival import barrier, claim_rank
from .auth import SilentPeerError, check_secret, client_handshake, job_secret
from .job import check_store_job, foreign_job
from .store_protocol import (_ERROR, _OP_NAMES, _RESPONSE, _TIMEOUT, ADD, CHECK, DELETE,
                             DEFAULT_MAX_VALUE_BYTES, GET, MAX_KEY_BYTES, MAX_TIMEOUT_S, SET, WAIT,
                             FrameError, Request, _recv_exact, decode_keys, encode_keys,
                             encode_request, read_request)
from .store_server import _listen, _Server
from .waiting import TIMEOUT_ENV, WaitReport, rendezvous_timeout

__all__ = [
    "ADD", "CHECK", "DEFAULT_MAX_VALUE_BYTES", "DELETE", "GET", "MAX_KEY_BYTES", "MAX_TIMEOUT_S",
    "SET", "WAIT", "FrameError", "Request", "StoreGoneError", "TCPStore", "barrier", "claim_rank", "decode_keys",
    "encode_keys", "encode_request", "read_request",
]

_GRACE_S = 10.0  # the server answers "timed out" itself; the socket waits this much longer
# A server answers a hello at once; one silent this long is busy, stopped or ending: try again.
_HANDSHAKE_S = 5.0


def _seconds(timeout: Union[float, timedelta, None], default: float) -> float:
    if timeout is None:
        return default
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not 0.0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT_S}] seconds, got {timeout!r}")
    return value


class StoreGoneError(RendezvousError):
    """The connection to the store failed under a request (the server closed or went away)."""


class TCPStore:
    """Key-value store for rendezvous; rank 0 passes ``is_server=True`` and serves it.

    Every rank, the server's own included, talks to the server over an authenticated socket.
    ``port=0`` on the server picks a free port (read ``.port``). Clients retry connecting
    for ``connect_timeout`` seconds, since the server may start after them, and when the
    connection fails under the handshake (reset, closed or silent: a busy, restarting or ending
    server), saying on stderr what they wait for (``waiting``); a wrong secret fails at once.
    ``connect_timeout`` defaults to the rendezvous timeout (600 s, or
    NEURAL_ARCH_RENDEZVOUS_TIMEOUT) within ``timeout``, which bounds each request and is the
    default wait of ``get`` and ``wait``. ``rank``, when given, is named in every error and
    message. ``job`` names the job the store serves (the server's) or the job this rank
    belongs to (a client's): a client that reaches another job's store fails at once, naming
    both (``job``).
    """

    def __init__(self, host: str, port: int, world_size: Optional[int] = None,
                 is_server: bool = False, secret: Optional[bytes] = None,
                 timeout: Union[float, timedelta] = 300.0, *,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 rank: Optional[int] = None, job: Optional[str] = None,
                 connect_timeout: Union[float, timedelta, None] = None) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535 or (port == 0 and not is_server):
            raise ValueError(f"store port must be an int in [1, 65535] (0 only for the server), "
                             f"got {port!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive int or None, got {world_size!r}")
        self.host, self.world_size, self.is_server, self.rank = host, world_size, is_server, rank
        self.job = job
        self.timeout = _seconds(timeout, 300.0)
        self._connect_limit = (None if connect_timeout is None
                               else _seconds(connect_timeout, self.timeout))
        if connect_timeout is None:  # a malformed setting fails here, before anything opens
            rendezvous_timeout(self.timeout)
        self._secret = (job_secret() if secret is None
                        else check_secret(secret, "the store's secret"))
        self._max_value = max_value_bytes
        self._lock = threading.Lock()
        self._sock: Optional[socket.socket] = None
        self._server: Optional[_Server] = None
        if is_server:
            listener = _listen(host, port)
            port = listener.getsockname()[1]
            clients = max(256, 4 * (world_size or 1))
            self._server = _Server(listener, self._secret, max_value_bytes,
                                   min(self.timeout, 30.0), clients, job)
        self.port = port
        try:
            self._join(self._connect_report())
        except BaseException:
            self.close()
            raise

    @property
    def connect_timeout(self) -> float:
        """Seconds that connecting waits for the server (see the class)."""
        if self._connect_limit is not None:
            return self._connect_limit
        return rendezvous_timeout(self.timeout)

    @property
    def local_address(self) -> str:
        """The address this process uses to reach the store (routable from the other ranks)."""
        with self._lock:
            if self._sock is None:
                self._connect(self._connect_report())
            return self._sock.getsockname()[0]

    @property
    def num_clients(self) -> int:
        """Authenticated connections the server serves now (server side only)."""
        if self._server is None:
            raise RuntimeError("num_clients is only known on the store's server")
        return self._server.num_clients

    def set_timeout(self, timeout: Union[float, timedelta]) -> None:
        """From now on, bound each request by ``timeout`` (the default wait of ``get`` and
        ``wait`` too, and the limit of connecting), as PyTorch's ``Store.set_timeout``."""
        self.timeout = _seconds(timeout, self.timeout)

    def _connect_report(self) -> WaitReport:
        limit = self.connect_timeout
        by_setting = self._connect_limit is None and limit < self.timeout
        return WaitReport(self.rank, f"for the store at {self.host}:{self.port} (rank 0 "
                          f"serves it)", limit, TIMEOUT_ENV if by_setting else "")

    def _join(self, report: WaitReport) -> None:
        """Connect, then check that the store serves this rank's job. The check is part of
        connecting: bounded by what is left of its wait, and a store that goes away under it
        is waited for again, as one that is not there yet (a job that ends frees its port)."""
        while True:
            self._connect(report)
            if self.job is None:
                return
            saved, self.timeout = self.timeout, max(report.limit - report.elapsed(), 1.0)
            try:
                check_store_job(self, self.job)
                return
            except StoreGoneError:
                if report.elapsed() >= report.limit:
                    raise
            finally:
                self.timeout = saved

    def _connect(self, report: WaitReport) -> None:
        delay, last_error = 0.01, "no attempt made"
        while True:
            remaining = report.limit - report.elapsed()
            if remaining <= 0:
                raise RendezvousError(
                    f"could not reach the store at {self.host}:{self.port} after waiting "
                    f"{report.limit:.1f} s (last error: {last_error}); is rank 0 running and "
                    f"MASTER_ADDR/MASTER_PORT the same on every rank?{report.set_by()}",
                    rank=self.rank, op="store.connect")
            report.say(f"last attempt: {last_error}")
            try:
                sock = socket.create_connection((self.host, self.port), timeout=min(remaining, 5))
            except OSError as e:
                last_error = str(e)
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.5)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                client_handshake(sock, self._secret, min(remaining, _HANDSHAKE_S))
            except (ConnectionError, SilentPeerError) as e:  # not a secret problem: try again
                sock.close()
                last_error = str(e)
                time.sleep(min(delay, max(report.limit - report.elapsed(), 0)))
                delay = min(delay * 2, 0.5)
                continue
            except AuthenticationError as e:
                sock.close()
                label = getattr(e, "peer_label", None)
                if self.job is not None and label is not None:  # another job's store
                    raise foreign_job(self.host, self.port, self.job, label, self.rank,
                                      verified=False) from e
                raise
            except BaseException:
                sock.close()
                raise
            self._sock = sock
            return

    def _call(self, op: int, label: str, raw_key: bytes, value: bytes = b"",
              wait_s: float = 0.0) -> bytes:
        what = f"store {_OP_NAMES[op]}({label!r})"
        where = dict(op=f"store.{_OP_NAMES[op]}", rank=self.rank)
        with self._lock:
            if self._sock is None:
                try:
                    self._connect(self._connect_report())
                except RendezvousError as e:
                    # the same error, said of this request: without _connect's own prefix
                    raise RendezvousError(f"{what}: {str(e).split('] ', 1)[-1]}",
                                          **where) from None
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
                                             **where) from None
            except (OSError, EOFError) as e:
                self._drop_connection()
                raise StoreGoneError(f"{what} failed: the store at {self.host}:{self.port} "
                                      f"went away ({e})", **where) from None
        if status == _TIMEOUT:
            raise CollectiveTimeoutError(f"{what} timed out after {wait_s:.1f} s waiting for "
                                         "the key(s) to be set", **where)
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
