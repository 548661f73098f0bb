"""The store's server: one thread at the door, and one thread per authenticated connection.

The door is a ``Gate``: connections prove the job secret there, in the accept thread, each
within a short deadline, so strangers never take a thread or a client's place. A peer that
breaks the wire format is dropped and the server carries on serving everyone else. Counters
(``add``) are stored as ASCII decimals, as PyTorch does.
"""
from __future__ import annotations

import errno
import selectors
import socket
import struct
import threading
import time
from typing import Optional

from ..errors import RendezvousError
from .gate import DEADLINE_S, Gate
from .job import JOB_KEY
from .store_protocol import (_ERROR, _OK, _RESPONSE, _TIMEOUT, ADD, CHECK, DELETE, GET, SET,
                             FrameError, Request, _recv_exact, decode_keys, read_request)

_IDLE_S = 0.5  # how long the door waits when nothing happens (``close`` wakes it sooner)


class _ClientGone(Exception):
    pass


class _Server:
    """Authenticates connections in one thread and serves each in its own daemon thread."""

    def __init__(self, listener: socket.socket, secret: bytes, max_value: int,
                 stall_timeout: float, max_clients: int, job: Optional[str] = None) -> None:
        self._listener, self._max_value = listener, max_value
        self._stall_timeout, self._max_clients = stall_timeout, max_clients
        # The job's identity is there before anyone connects: a rank reads it first (``job``).
        self._data: dict[bytes, bytes] = {} if job is None else {JOB_KEY.encode(): job.encode()}
        self._cond = threading.Condition()
        self._conns: set[socket.socket] = set()
        self._conns_lock = threading.Lock()
        self._stop = threading.Event()
        self._gate = Gate(listener, secret, min(stall_timeout, DEADLINE_S),
                          label=(job or "").encode())
        self._thread = threading.Thread(target=self._accept_loop, name="store-accept", daemon=True)
        self._thread.start()

    @property
    def num_clients(self) -> int:
        with self._conns_lock:
            return len(self._conns)

    def _accept_loop(self) -> None:
        try:
            while not self._stop.is_set():
                for arrival in self._gate.poll(_IDLE_S):
                    if arrival.conn is not None:
                        self._admit(arrival)
        finally:
            self._gate.close()

    def _admit(self, arrival) -> None:
        """Serve an authenticated connection on a thread of its own, while there is room.
        It is counted before the client hears that it is in."""
        conn = arrival.conn
        with self._conns_lock:
            if self._stop.is_set() or len(self._conns) >= self._max_clients:
                conn.close()
                return
            self._conns.add(conn)
        try:
            arrival.accept()
        except OSError:  # gone before it heard
            with self._conns_lock:
                self._conns.discard(conn)
            conn.close()
            return
        threading.Thread(target=self._serve, args=(conn,), daemon=True,
                         name=f"store-conn-{arrival.addr}").start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(self._stall_timeout)  # bound on stalls inside one frame
            with selectors.DefaultSelector() as sel:
                sel.register(conn, selectors.EVENT_READ)
                while not self._stop.is_set():
                    if not sel.select(0.5):
                        continue
                    req = read_request(lambda n: _recv_exact(conn, n), self._max_value)
                    status, payload = self._execute(req, conn)
                    conn.sendall(_RESPONSE.pack(status, len(payload)) + payload)
        except (FrameError, EOFError, OSError, _ClientGone):
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
        self._gate.wake()
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


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback (a server there listens on it alone)."""
    return host in ("localhost", "::1") or host.startswith("127.")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Non-loopback names may resolve to 127.0.1.1 locally; listening everywhere avoids that trap.
    bind_host = host if is_loopback(host) else ("::" if family == socket.AF_INET6 else "")
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
