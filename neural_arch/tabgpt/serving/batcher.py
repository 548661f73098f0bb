"""``DynamicBatcher``: requests of different sizes and lengths gathered into padded batches.

A request is an array of rows, shape ``(rows, length, ...)`` or ``(rows, length)``; its rows
stay together and in order. A batch takes whole requests, oldest first, until one more would
pass ``max_batch_size`` rows; it is ready when it is full or when its oldest request has waited
``timeout_ms``. ``padding_strategy`` says how rows of different lengths (axis 1) are made one
array: ``"longest"`` pads to the longest row of the batch, ``"max_length"`` to ``max_length``
(a longer request is refused when it arrives), ``"do_not_pad"`` refuses a batch whose lengths
differ. ``mask`` marks the real positions (True) against the padding.

The guide's loop is the polling form: ``add_request(rows)`` says whether a batch is ready and
``get_batch()`` takes it. ``next_batch()`` is the waiting form: it sleeps on the ``changed``
condition until the oldest request's deadline, or until a request fills a batch, and takes the
batch, looking and sleeping under one hold of the lock so that no request arriving in between
goes unnoticed. ``BatchingWorker`` (``serving.worker``) runs a model on each batch on a thread
of its own and hands every caller its own rows of the result.
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, List, Optional

import numpy as np

__all__ = ["DynamicBatcher", "PaddedBatch", "PADDING_STRATEGIES"]

PADDING_STRATEGIES = ("longest", "max_length", "do_not_pad")


@dataclass
class PaddedBatch:
    """``data`` (rows of every request, padded), ``mask`` (rows, length) True where real,
    ``sizes`` the rows of each request in order, ``requests`` what ``add_request`` returned."""

    data: np.ndarray
    mask: np.ndarray
    sizes: List[int]
    requests: List[Any]

    def split(self, outputs: Any) -> List[Any]:
        """``outputs`` (one entry per row of the batch) cut back into each request's rows."""
        total = sum(self.sizes)
        if len(outputs) != total:
            raise ValueError(f"the model returned {len(outputs)} rows for a batch of {total} "
                             f"rows ({len(self.sizes)} requests of {self.sizes})")
        bounds = np.cumsum([0] + self.sizes)
        return [outputs[lo:hi] for lo, hi in zip(bounds[:-1], bounds[1:])]


@dataclass
class _Request:
    rows: np.ndarray
    arrived: float
    ticket: Any


class DynamicBatcher:
    def __init__(self, max_batch_size: int = 64, timeout_ms: float = 100,
                 padding_strategy: str = "longest", max_length: Optional[int] = None,
                 pad_value: float = 0.0) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) \
                or max_batch_size < 1:
            raise ValueError(f"DynamicBatcher max_batch_size must be a positive integer, got "
                             f"{max_batch_size!r}")
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) \
                or not timeout_ms >= 0:
            raise ValueError(f"DynamicBatcher timeout_ms must be a number >= 0, got "
                             f"{timeout_ms!r}")
        if padding_strategy not in PADDING_STRATEGIES:
            raise ValueError(f"DynamicBatcher padding_strategy must be one of "
                             f"{list(PADDING_STRATEGIES)}, got {padding_strategy!r}")
        if (padding_strategy == "max_length") != (max_length is not None):
            raise ValueError(f"DynamicBatcher: max_length={max_length!r} goes with "
                             f"padding_strategy='max_length' and only with it (got "
                             f"{padding_strategy!r})")
        self.max_batch_size, self.timeout_s = max_batch_size, float(timeout_ms) / 1e3
        self.padding_strategy, self.max_length = padding_strategy, max_length
        self.pad_value = pad_value
        self._pending: Deque[_Request] = deque()
        self._rows = 0
        # notified when a request is the first pending one (a new deadline) or makes a batch
        # ready: a thread in next_batch needs no other wake-up, so the rest arrive quietly
        self.changed = threading.Condition()

    # ------------------------------------------------------------------ requests
    def add_request(self, rows: Any, ticket: Any = None) -> bool:
        """Queue ``rows``; True when a batch is ready (full, or its oldest request timed out).
        ``ticket`` comes back in ``PaddedBatch.requests`` (the index of the request if None)."""
        array = np.asarray(rows)
        if array.ndim < 2 or array.shape[0] == 0:
            raise ValueError(f"a request is an array of rows, shape (rows, length, ...) with at "
                             f"least one row, got shape {array.shape}")
        if array.shape[0] > self.max_batch_size:
            raise ValueError(f"a request of {array.shape[0]} rows cannot fit a batch of "
                             f"max_batch_size={self.max_batch_size}; split it")
        if self.max_length is not None and array.shape[1] > self.max_length:
            raise ValueError(f"a request of length {array.shape[1]} is longer than "
                             f"max_length={self.max_length}")
        with self.changed:
            first = not self._pending
            self._pending.append(_Request(array, time.monotonic(), ticket))
            self._rows += array.shape[0]
            ready = self._ready_locked(time.monotonic())
            if first or ready:
                self.changed.notify_all()
            return ready

    def pending_rows(self) -> int:
        with self.changed:
            return self._rows

    def ready(self) -> bool:
        with self.changed:
            return self._ready_locked(time.monotonic())

    def _ready_locked(self, now: float) -> bool:
        if not self._pending:
            return False
        return self._rows >= self.max_batch_size or self._next_fills() or \
            now - self._pending[0].arrived >= self.timeout_s

    def _next_fills(self) -> bool:
        """The oldest requests fill a batch: one more would not fit."""
        total = 0
        for request in self._pending:
            if total + len(request.rows) > self.max_batch_size:
                return True
            total += len(request.rows)
        return False

    def seconds_until_ready(self) -> Optional[float]:
        """0 when ready, the oldest request's remaining wait, or None with nothing pending."""
        with self.changed:
            now = time.monotonic()
            if self._ready_locked(now):
                return 0.0
            if not self._pending:
                return None
            return max(0.0, self._pending[0].arrived + self.timeout_s - now)

    # ------------------------------------------------------------------ batches
    def get_batch(self, force: bool = False) -> Optional[PaddedBatch]:
        """The next batch (None when none is ready; ``force``: whatever is pending)."""
        with self.changed:
            if not self._pending or not (force or self._ready_locked(time.monotonic())):
                return None
            taken = self._take_locked()
        return self._padded(taken)

    def next_batch(self, idle_s: float, flush: Callable[[], bool] = lambda: False
                   ) -> Optional[PaddedBatch]:
        """Wait for the next batch and take it: until the oldest pending request's deadline
        (``timeout_ms`` after it arrived: its batch's first) or until a request makes a batch
        full. With nothing pending, waits at most ``idle_s`` for a request, then returns None.
        ``flush()`` true (closing): whatever is pending, without waiting; None once empty.
        The padding and the caller's model run outside the lock."""
        with self.changed:
            waited_idle = False
            while True:
                now = time.monotonic()
                if self._pending:
                    if flush() or self._ready_locked(now):
                        taken = self._take_locked()
                        break
                    self.changed.wait(timeout=self._pending[0].arrived + self.timeout_s - now)
                elif waited_idle or flush():
                    return None
                else:
                    self.changed.wait(timeout=idle_s)
                    waited_idle = True
        return self._padded(taken)

    def _take_locked(self) -> List[_Request]:
        """The oldest requests, as many whole ones as fit ``max_batch_size`` rows."""
        taken, total = [], 0
        while self._pending and total + len(self._pending[0].rows) <= self.max_batch_size:
            request = self._pending.popleft()
            taken.append(request)
            total += len(request.rows)
        self._rows -= total
        return taken

    def _padded(self, taken: List[_Request]) -> PaddedBatch:
        try:
            return self._pad(taken)
        except ValueError as exc:  # the requests are taken: their callers must hear of it
            exc.tickets = [r.ticket for r in taken]
            raise

    def _pad(self, taken: List[_Request]) -> PaddedBatch:
        lengths = [r.rows.shape[1] for r in taken]
        tails = {r.rows.shape[2:] for r in taken}
        if len(tails) != 1:
            raise ValueError(f"requests of one batch differ beyond their length: shapes "
                             f"{[r.rows.shape for r in taken]}")
        if self.padding_strategy == "do_not_pad" and len(set(lengths)) != 1:
            raise ValueError(f"padding_strategy='do_not_pad' and the batch's requests have "
                             f"lengths {lengths}")
        width = self.max_length if self.padding_strategy == "max_length" else max(lengths)
        dtype = np.result_type(*[r.rows.dtype for r in taken])
        rows = sum(len(r.rows) for r in taken)
        sizes, tickets = [len(r.rows) for r in taken], [r.ticket for r in taken]
        if min(lengths) == width:  # nothing to pad (a table's rows): one copy, no per-row loop
            data = np.concatenate([r.rows for r in taken], axis=0).astype(dtype, copy=False)
            return PaddedBatch(data, np.ones((rows, width), dtype=bool), sizes, tickets)
        data = np.full((rows, width) + tails.pop(), self.pad_value, dtype=dtype)
        mask = np.zeros((rows, width), dtype=bool)
        start = 0
        for request in taken:
            n, length = request.rows.shape[:2]
            data[start:start + n, :length] = request.rows
            mask[start:start + n, :length] = True
            start += n
        return PaddedBatch(data, mask, sizes, tickets)
