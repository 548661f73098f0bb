"""Asynchronous collectives: the ``Work`` handle, the queue that runs them in issue order, and
``Future`` (PyTorch's ``torch.futures.Future``), the lazily resolved value communication
hooks return.

All groups of a process share one transport, so they share one ``CommQueue``: a single
background thread runs ``async_op=True`` collectives in the order they were issued, and a
synchronous call first waits for that queue to drain, then runs on the caller's thread. The
transport is therefore used by one thread at a time, and every rank issues messages in the same
order.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from datetime import timedelta
from typing import Any, Callable, Optional, Union

from .errors import CollectiveTimeoutError, DistributedError

Seconds = Union[float, int, timedelta]


def to_seconds(timeout: Seconds, what: str = "timeout") -> float:
    value = timeout.total_seconds() if isinstance(timeout, timedelta) else timeout
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{what} must be positive seconds or a timedelta, got {timeout!r}")
    return float(value)


class Work:
    """Handle of one asynchronous collective (PyTorch's ``Work``)."""

    def __init__(self, op: str, seq: Optional[int], rank: int, default_timeout: float) -> None:
        self.op, self.seq, self.rank = op, seq, rank
        self._default_timeout = default_timeout
        self._done = threading.Event()
        self._result: Any = None
        self._error: Optional[BaseException] = None
        # time.perf_counter() when the queue's thread began and ended running it (None until
        # then, and for work that never went through the queue): DDP's hidden communication
        self.started: Optional[float] = None
        self.finished: Optional[float] = None

    @classmethod
    def completed(cls, op: str, result: Any, rank: int) -> "Work":
        work = cls(op, None, rank, 1.0)
        work._finish(result, None)
        return work

    def _finish(self, result: Any, error: Optional[BaseException]) -> None:
        self._result, self._error = result, error
        self._done.set()

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Optional[BaseException]:
        return self._error

    def wait(self, timeout: Optional[Seconds] = None) -> bool:
        """Block until done; re-raise the collective's error. Returns True on success."""
        limit = self._default_timeout if timeout is None else to_seconds(timeout)
        if not self._done.wait(limit):
            raise CollectiveTimeoutError(f"not completed within {limit:g} s of waiting",
                                         rank=self.rank, op=self.op, seq=self.seq)
        if self._error is not None:
            raise self._error
        return True

    synchronize = wait

    def get_future(self) -> "Future":
        """A future of ``[result]``, as PyTorch's ``Work.get_future()`` (so hooks written for
        PyTorch read ``future.value()[0]``)."""
        return Future(lambda: [self.result()])

    def result(self) -> Any:
        """What the synchronous call would have returned (after waiting)."""
        self.wait()
        return self._result

    def __repr__(self) -> str:
        state = ("pending" if not self._done.is_set()
                 else "failed" if self._error is not None else "completed")
        return f"Work({self.op} #{self.seq}, {state})"


class Future:
    """A value still to come, as ``torch.futures.Future``: ``wait()``, ``value()``, ``done()``,
    ``then(callback)``; what communication hooks return.

    It resolves lazily: ``wait()`` runs the steps still to do (waiting for a collective, then
    whatever ``then`` chained after it) on the caller's thread, once, and keeps the value or
    the error. Collectives issued from those steps therefore come in the order the futures are
    waited for, which a caller keeps the same on every rank (DDP waits in bucket order).
    """

    def __init__(self, resolve: Callable[[], Any]) -> None:
        self._resolve: Optional[Callable[[], Any]] = resolve
        self._value: Any = None
        self._error: Optional[BaseException] = None

    @classmethod
    def completed(cls, value: Any) -> "Future":
        """A future already holding ``value``."""
        future = cls(lambda: value)
        future.wait()
        return future

    @classmethod
    def after(cls, work: Work, value: Any) -> "Future":
        """``value`` once the asynchronous collective ``work`` (a ``Work``) has finished."""
        def resolve() -> Any:
            work.wait()
            return value
        return cls(resolve)

    def done(self) -> bool:
        return self._resolve is None

    def wait(self) -> Any:
        """Run what is left, once; return the value (or raise what running it raised)."""
        if self._resolve is not None:
            resolve, self._resolve = self._resolve, None
            try:
                self._value = resolve()
            except BaseException as exc:
                self._error = exc
        if self._error is not None:
            raise self._error
        return self._value

    def value(self) -> Any:
        """The value of a future already waited for (as in ``then`` callbacks)."""
        if self._resolve is not None:
            raise RuntimeError("Future.value() before the future completed: call wait(), or "
                               "read value() inside a then() callback")
        return self.wait()

    def then(self, callback: Callable[["Future"], Any]) -> "Future":
        """A future of ``callback(self)``, called once this one completed."""
        def resolve() -> Any:
            self.wait()
            return callback(self)
        return Future(resolve)

    def __repr__(self) -> str:
        state = "pending" if self._resolve is not None else (
            "failed" if self._error is not None else "completed")
        return f"Future({state})"


class CommQueue:
    """Runs queued collectives one at a time, in issue order, on one background thread."""

    def __init__(self, rank: int, timeout: float) -> None:
        self.rank, self.timeout = rank, timeout
        self._items: deque[tuple[Callable[[], Any], Work]] = deque()
        self._cond = threading.Condition()
        self._running = False
        self._closed = False
        # held while a collective runs, on whichever thread: the queue's or a caller's
        self.exec_lock = threading.Lock()
        self._thread: Optional[threading.Thread] = None

    def submit(self, fn: Callable[[], Any], op: str, seq: Optional[int]) -> Work:
        # A queued op may wait for everything ahead of it, each bounded by the transport timeout.
        with self._cond:
            if self._closed:
                raise DistributedError("the process group was destroyed", rank=self.rank, op=op,
                                       seq=seq)
            work = Work(op, seq, self.rank, self.timeout * (len(self._items) + 2))
            self._items.append((fn, work))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, daemon=True,
                                                name=f"neural_arch-collectives-{self.rank}")
                self._thread.start()
            self._cond.notify_all()
        return work

    def run_sync(self, fn: Callable[..., Any], op: str, seq: Optional[int], *args: Any) -> Any:
        """``fn(*args)`` on the calling thread, after every queued collective."""
        if self._items or self._running:
            self.drain(op, seq)
        with self.exec_lock:
            return fn(*args)

    def drain(self, op: str = "wait for pending work", seq: Optional[int] = None) -> None:
        if not self._items and not self._running:  # the common case: nothing queued
            return
        with self._cond:
            limit = self.timeout * (len(self._items) + 1 + self._running)
            if not self._cond.wait_for(lambda: not self._items and not self._running, limit):
                raise CollectiveTimeoutError(
                    f"{len(self._items)} earlier asynchronous collectives did not finish within "
                    f"{limit:g} s", rank=self.rank, op=op, seq=seq)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items and not self._closed:
                    self._cond.wait(1.0)
                if not self._items:
                    return
                # flag first, then pop: an unlocked reader (drain's fast path) never sees
                # "nothing queued and nothing running" while this item is still to run
                self._running = True
                fn, work = self._items.popleft()
            try:
                with self.exec_lock:
                    work.started = time.perf_counter()
                    result = fn()
            except BaseException as exc:  # handed to whoever waits on the Work
                work.finished = time.perf_counter()
                work._finish(None, exc)
            else:
                work.finished = time.perf_counter()
                work._finish(result, None)
            finally:
                # the finished collective's closure and result hold its buffers (an FSDP
                # unit's whole flat gradient, say): not kept alive until the next one
                fn = work = result = None
                with self._cond:
                    self._running = False
                    self._cond.notify_all()

    def close(self, timeout: Optional[float] = None) -> None:
        """Let queued work finish (bounded by ``timeout``), then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(self.timeout if timeout is None else timeout)
