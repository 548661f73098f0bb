"""The gate of a listening socket: accept every connection and authenticate it, all in one
thread, each connection within a short deadline of its own.

A connection that has not proved the job secret yet is a stranger. Strangers wait in one
selector, each with a ``ServerHandshake`` advanced whenever its bytes arrive: a thousand
silent ones cost a thousand idle descriptors and no thread, and a rank that arrives behind them
is answered as soon as it speaks. There is no count of handshakes in flight for strangers to
fill. A stranger is dropped when its deadline passes, when it breaks the protocol, and, oldest
first, when the strangers reach ``max_pending`` or the process runs out of descriptors: a
stranger only ever makes room by displacing another stranger, and a rank needs its place for
a few milliseconds only.

The store's server and the TCP mesh's accept loop both let a ``Gate`` stand at their door.
"""
from __future__ import annotations

import errno
import resource
import selectors
import socket
import time
from typing import NamedTuple, Optional

from ..errors import AuthenticationError
from .auth import ServerHandshake

DEADLINE_S = 5.0  # a rank proves the secret in milliseconds; this is for a loaded machine
_ACCEPT_BURST = 256  # connections accepted per wake-up, so that waiting handshakes get a turn
_PAUSE_S = 0.1  # out of descriptors with no stranger to drop: try accepting again after this
_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)


class Arrival(NamedTuple):
    """A handshake that ended: ``conn`` (blocking) and the client's ``info`` when it proved the
    secret; otherwise ``conn`` is None, the connection is closed and ``error`` says why.

    The client still waits to hear that it is in: the new owner of ``conn`` takes it in, then
    calls ``accept`` (or closes it, and the client hears nothing)."""
    conn: Optional[socket.socket]
    addr: object
    info: Optional[bytes]
    error: Optional[Exception]
    shake: Optional[ServerHandshake] = None

    def accept(self) -> None:
        """Tell the client it is in; an OSError when it is gone meanwhile."""
        self.shake.accept()


def default_max_pending() -> int:
    """Half the descriptors this process may open, within [16, 4096]: the other half stays for
    the ranks' connections and everything else the process opens."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 4096
    return max(16, min(4096, soft // 2))


class _Stranger(NamedTuple):
    addr: object
    shake: ServerHandshake
    deadline: float


class Gate:
    """Authenticates the connections of ``listener``; not thread-safe except for ``wake``.

    The caller owns the listener (the gate makes it non-blocking) and every connection handed
    over by ``poll``; ``close`` drops the strangers still waiting.
    """

    def __init__(self, listener: socket.socket, secret: bytes, deadline_s: float = DEADLINE_S,
                 max_pending: Optional[int] = None, label: bytes = b"") -> None:
        if not deadline_s > 0:
            raise ValueError(f"deadline_s must be > 0 seconds, got {deadline_s!r}")
        self._listener, self._secret, self._deadline_s = listener, secret, float(deadline_s)
        self._label = label  # what each handshake shows of this server (``auth``)
        self._max_pending = default_max_pending() if max_pending is None else int(max_pending)
        if self._max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending!r}")
        self._pending: dict[socket.socket, _Stranger] = {}  # oldest first
        self._paused_until: Optional[float] = None
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        listener.setblocking(False)
        self._sel = selectors.DefaultSelector()
        self._sel.register(listener, selectors.EVENT_READ)
        self._sel.register(self._wake_r, selectors.EVENT_READ)

    @property
    def pending(self) -> int:
        """Strangers waiting now."""
        return len(self._pending)

    def poll(self, timeout: float) -> list[Arrival]:
        """Wait at most ``timeout`` seconds (less when a deadline or ``wake`` comes first),
        advance what became readable, and return the handshakes that ended."""
        arrivals: list[Arrival] = []
        wait = max(0.0, timeout)
        if self._pending:
            wait = min(wait, next(iter(self._pending.values())).deadline - time.monotonic())
        if self._paused_until is not None:
            wait = min(wait, self._paused_until - time.monotonic())
        for key, _ in self._sel.select(max(0.0, wait)):
            if key.fileobj is self._listener:
                self._accept(arrivals)
            elif key.fileobj is self._wake_r:
                self._wake_r.recv(4096)
            elif key.fileobj in self._pending:
                self._step(key.fileobj, arrivals)
        self._expire(arrivals)
        if self._paused_until is not None and time.monotonic() >= self._paused_until:
            self._paused_until = None
            self._sel.register(self._listener, selectors.EVENT_READ)
        return arrivals

    def wake(self) -> None:
        """Make a ``poll`` in another thread return now."""
        try:
            self._wake_w.send(b"x")
        except OSError:  # already closed, or a wake-up is already waiting
            pass

    def close(self) -> None:
        """Drop every stranger still waiting. Safe to call twice."""
        for conn in list(self._pending):
            self._forget(conn).close()
        self._sel.close()
        self._wake_r.close()
        self._wake_w.close()

    def _accept(self, arrivals: list[Arrival]) -> None:
        for _ in range(_ACCEPT_BURST):
            try:
                conn, addr = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno not in _OUT_OF_DESCRIPTORS:
                    continue  # that connection died before we took it; the next may be fine
                if not self._pending:  # nothing of ours to give back: wait instead of spinning
                    self._sel.unregister(self._listener)
                    self._paused_until = time.monotonic() + _PAUSE_S
                    return
                self._drop_oldest(arrivals, "this process ran out of file descriptors")
                continue
            if len(self._pending) >= self._max_pending:
                self._drop_oldest(arrivals, f"{self._max_pending} strangers were waiting")
            conn.setblocking(False)
            self._pending[conn] = _Stranger(addr, ServerHandshake(conn, self._secret, self._label),
                                            time.monotonic() + self._deadline_s)
            self._sel.register(conn, selectors.EVENT_READ)

    def _step(self, conn: socket.socket, arrivals: list[Arrival]) -> None:
        stranger = self._pending[conn]
        try:
            info = stranger.shake.step()
        except (AuthenticationError, OSError) as e:
            self._forget(conn).close()
            arrivals.append(Arrival(None, stranger.addr, None, e))
            return
        if info is not None:
            self._forget(conn).setblocking(True)
            arrivals.append(Arrival(conn, stranger.addr, info, None, stranger.shake))

    def _expire(self, arrivals: list[Arrival]) -> None:
        now = time.monotonic()
        while self._pending:
            conn, stranger = next(iter(self._pending.items()))
            if stranger.deadline > now:
                return
            self._forget(conn).close()
            arrivals.append(Arrival(None, stranger.addr, None, stranger.shake.expired()))

    def _drop_oldest(self, arrivals: list[Arrival], why: str) -> None:
        conn, stranger = next(iter(self._pending.items()))
        self._forget(conn).close()
        arrivals.append(Arrival(None, stranger.addr, None, AuthenticationError(
            f"{stranger.shake.peer} was dropped before it proved the job secret: {why}")))

    def _forget(self, conn: socket.socket) -> socket.socket:
        self._sel.unregister(conn)
        del self._pending[conn]
        return conn
