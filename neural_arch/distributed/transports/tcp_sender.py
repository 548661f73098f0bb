"""The tcp transport's sending thread: large sends move while the caller's thread receives.

One thread that alternates between writing to a socket and reading from another moves a
large exchange at a fraction of the speed the kernel allows: while it copies a piece out, the
peer's data waits in the socket buffer, and while it reads, its own socket buffer drains
unfilled, so both ranks keep waking each other up. With the sends on a thread of their own
(``sendmsg`` and ``poll`` release the GIL), the two directions of a socket move at once, as
MPI's progress engines and NCCL's proxy threads move them; on one host, a 16 MiB exchange
took about a third of the time.

A ``SendWorker`` serves one transport and one call at a time: ``begin`` hands it the call's
sends, ``add`` the follow-ups of chained receives, and the caller's loop receives meanwhile,
asks ``check`` (the worker's error, raised in the caller's thread) and ``idle``, and waits on
``wake_fd`` (readable when the worker finished or failed). ``cancel`` stops it mid-call when
the caller gives up (an error, a timeout); the half-sent messages then leave their streams
unusable, as in the caller's own loop. The thread starts on first use and ends with
``close``.
"""
from __future__ import annotations

import os
import select
import threading
from typing import Callable, List, Optional

_POLL_SLICE_S = 0.05  # how soon a waiting worker notices ``cancel`` or ``close``


class SendWorker:
    """Moves the sends of one call at a time (see the module docstring). ``pump(op)`` writes
    what the socket takes of ``op`` (True when it moved bytes) and raises on a broken socket;
    ``socket_of(op)`` is the socket ``op`` goes to; ``heads(ops)`` the first op per peer."""

    def __init__(self, pump: Callable, socket_of: Callable, heads: Callable) -> None:
        self._pump, self._socket_of, self._heads = pump, socket_of, heads
        self._cond = threading.Condition()
        self.ops: List = []  # this call's sends still moving, in the order given
        self._error: Optional[BaseException] = None
        self._busy = False  # between taking a job and parking again
        self._cancelled = self._closed = False
        self._thread: Optional[threading.Thread] = None
        self.wake_fd, self._wake_w = os.pipe()
        os.set_blocking(self.wake_fd, False)
        os.set_blocking(self._wake_w, False)

    # ---- the caller's side -------------------------------------------------------------------
    def begin(self, ops: List) -> None:
        with self._cond:
            self.ops, self._error, self._cancelled = list(ops), None, False
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, daemon=True,
                                                name="tcp-sender")
                self._thread.start()
            self.drain()
            self._cond.notify()

    def add(self, ops: List) -> None:
        if ops:
            with self._cond:
                self.ops += ops
                self._cond.notify()

    def check(self) -> None:
        """Raise the worker's error, if it failed."""
        if self._error is not None:
            raise self._error

    def idle(self) -> bool:
        """True once every send of the call went out (or the worker failed)."""
        with self._cond:
            return not self.ops or self._error is not None

    def cancel(self) -> None:
        """Stop sending this call's messages; returns once the thread is parked (or after a
        few poll slices, should a ``sendmsg`` be stuck)."""
        with self._cond:
            self._cancelled = True
            self._cond.notify()
            self._cond.wait_for(lambda: not self._busy, timeout=4 * _POLL_SLICE_S)
        self.drain()

    def close(self) -> None:
        with self._cond:
            self._closed = self._cancelled = True
            self._cond.notify()
            fds, self.wake_fd, self._wake_w = (self.wake_fd, self._wake_w), -1, -1
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=1.0)
        for fd in fds:
            if fd >= 0:
                os.close(fd)

    def drain(self) -> None:
        """Empty ``wake_fd`` (the caller woke on it)."""
        try:
            while os.read(self.wake_fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass

    # ---- the thread ------------------------------------------------------------------------
    def _serve(self) -> None:
        while True:
            with self._cond:
                self._busy = False
                self._cond.notify_all()
                self._cond.wait_for(lambda: self._closed or (
                    self.ops and not self._cancelled and self._error is None))
                if self._closed:
                    return
                self._busy = True
                heads = self._heads(self.ops)
            try:
                moved = any([self._pump(op) for op in heads])
                if not moved:
                    poller = select.poll()
                    for op in heads:
                        poller.register(self._socket_of(op), select.POLLOUT)
                    poller.poll(int(_POLL_SLICE_S * 1000))
            except BaseException as e:  # the caller raises it (``check``)
                with self._cond:
                    self._error = e
                self._signal()
                continue
            with self._cond:
                self.ops = [op for op in self.ops if op.views]
                finished = not self.ops
            if finished:
                self._signal()

    def _signal(self) -> None:
        try:
            os.write(self._wake_w, b"!")
        except OSError:  # full (the caller drains it) or closed
            pass
