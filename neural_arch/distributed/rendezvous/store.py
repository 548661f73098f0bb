"""A small authenticated TCP key-value store, served by rank 0, that ranks rendezvous through.

This module holds the client every rank uses (``TCPStore``) and ``barrier``; the wire format is
in ``store_protocol`` and the server in ``store_server``. Their public names are importable from
here too.
"""
from __future__ import annotations

import os
import socket
import struct
import threading
import time
from datetime import timedelta
from typing import Iterable, Optional, Union

from ..errors import AuthenticationError, CollectiveTimeoutError, RendezvousError
from .auth import check_secret, client_handshake, job_secret
from .job import check_store_job, foreign_job
from .store_protocol import (_ERROR, _OP_NAMES, _RESPONSE, _TIMEOUT, ADD, CHECK, DELETE,
                             DEFAULT_MAX_VALUE_BYTES, GET, MAX_KEY_BYTES, MAX_TIMEOUT_S, SET, WAIT,
                             FrameError, Request, _recv_exact, decode_keys, encode_keys,
                             encode_request, read_request)
from .store_server import _listen, _Server

__all__ = [
    "ADD", "CHECK", "DEFAULT_MAX_VALUE_BYTES", "DELETE", "GET", "MAX_KEY_BYTES", "MAX_TIMEOUT_S",
    "SET", "WAIT", "FrameError", "Request", "TCPStore", "barrier", "claim_rank", "decode_keys",
    "encode_keys", "encode_request", "read_request",
]

_GRACE_S = 10.0  # the server answers "timed out" itself; the socket waits this much longer


def _seconds(timeout: Union[float, timedelta, None], default: float) -> float:
    if timeout is None:
        return default
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if not 0.0 < value <= MAX_TIMEOUT_S:
        raise ValueError(f"timeout must be in (0, {MAX_TIMEOUT_S}] seconds, got {timeout!r}")
    return value


class TCPStore:
    """Key-value store for rendezvous; rank 0 passes ``is_server=True`` and serves it.

    Every rank, the server's own included, talks to the server over an authenticated socket.
    ``port=0`` on the server picks a free port (read ``.port``). Clients retry connecting
    until ``timeout``, since the server may start after them, and when the connection fails
    under the handshake (reset or closed: a busy or restarting server); a wrong secret fails at
    once. ``rank``, when given, is named in every error. ``job`` names the job the store
    serves (the server's) or the job this rank belongs to (a client's): a client that reaches
    another job's store fails at once, naming both (``job``).
    """

    def __init__(self, host: str, port: int, world_size: Optional[int] = None,
                 is_server: bool = False, secret: Optional[bytes] = None,
                 timeout: Union[float, timedelta] = 300.0, *,
                 max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
                 rank: Optional[int] = None, job: Optional[str] = None) -> None:
        if not isinstance(port, int) or not 0 <= port <= 65535 or (port == 0 and not is_server):
            raise ValueError(f"store port must be an int in [1, 65535] (0 only for the server), "
                             f"got {port!r}")
        if world_size is not None and (not isinstance(world_size, int) or world_size < 1):
            raise ValueError(f"world_size must be a positive int or None, got {world_size!r}")
        self.host, self.world_size, self.is_server, self.rank = host, world_size, is_server, rank
        self.job = job
        self.timeout = _seconds(timeout, 300.0)
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
            self._connect(self.timeout)
            if job is not None:
                check_store_job(self, job)
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
        """Authenticated connections the server serves now (server side only)."""
        if self._server is None:
            raise RuntimeError("num_clients is only known on the store's server")
        return self._server.num_clients

    def set_timeout(self, timeout: Union[float, timedelta]) -> None:
        """From now on, bound connecting and each request by ``timeout`` (the default wait of
        ``get`` and ``wait`` too), as PyTorch's ``Store.set_timeout``."""
        self.timeout = _seconds(timeout, self.timeout)

    def _connect(self, timeout: float) -> None:
        start = time.monotonic()
        delay, last_error = 0.01, "no attempt made"
        while True:
            remaining = timeout - (time.monotonic() - start)
            if remaining <= 0:
                raise RendezvousError(
                    f"could not reach the store at {self.host}:{self.port} after waiting "
                    f"{timeout:.1f} s (last error: {last_error}); is rank 0 running and "
                    "MASTER_ADDR/MASTER_PORT the same on every rank?", rank=self.rank,
                    op="store.connect")
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
            except ConnectionError as e:  # not a secret problem: try again, as when refused
                sock.close()
                last_error = str(e)
                time.sleep(min(delay, max(timeout - (time.monotonic() - start), 0)))
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
                    self._connect(self.timeout)
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
                raise RendezvousError(f"{what} failed: the store at {self.host}:{self.port} "
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


_CLAIM_KEY = "neural_arch/init/rank"


def claim_rank(store: TCPStore, rank: int) -> None:
    """Join ``store`` as ``rank``, or raise RendezvousError when another process already did.

    Rank 0 serves a fresh store for each job (and each restart), so each rank joins it once. A
    second claim means this rank reached another job's store: one started on the same
    MASTER_ADDR/MASTER_PORT with the same secret (its own rank 0 then failed to bind the port),
    or two processes of one job were given the same RANK. Without this check such a rank would
    read the other job's rendezvous data and wait for its own rank 0 until the timeout.
    """
    key = f"{_CLAIM_KEY}/{rank}"
    claims = store.add(key, 1)
    if claims == 1:
        store.set(f"{key}/by", f"pid {os.getpid()} on host {socket.gethostname()}")
        return
    # The first claimant writes who it is right after claiming; wait for that only briefly.
    try:
        holder = store.get(f"{key}/by", timeout=1.0).decode(errors="replace")
    except CollectiveTimeoutError:
        holder = "a process that has not said who it is yet"
    raise RendezvousError(
        f"the store at {store.host}:{store.port} already has a rank {rank}: {holder} joined it "
        f"as rank {rank} first (this process is join {claims} of rank {rank}). This store serves "
        "another job, started on the same MASTER_ADDR/MASTER_PORT with the same secret, or two "
        f"processes were given RANK={rank}; give each job its own MASTER_PORT", rank=rank,
        op="init_process_group")
