"""``DynamicBatcher``: requests of different sizes and lengths gathered into padded batches.

A request is an array of rows, shape ``(rows, length, ...)`` or ``(rows, length)``; its rows
stay together and in order. A batch takes whole requests, oldest first, until one more would
pass ``max_batch_size`` rows; it is ready when it is full or when its oldest request has waited
``timeout_ms``. ``padding_strategy`` says how rows of different lengths (axis 1) are made one
array: ``"longest"`` pads to the longest row of the batch, ``"max_length"`` to ``max_length``
(a longer request is refused when it arrives), ``"do_not_pad"`` refuses a batch whose lengths
differ. ``mask`` marks the real positions (True) against the padding.

The guide's loop is the polling form: ``add_request(rows)`` says whether a batch is ready and
``get_batch()`` takes it. ``BatchingWorker`` (``serving.worker``) is the threaded form, which
runs a model on each batch and hands every caller its own rows of the result.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any, List, Optional

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
        self._pending: List[_Request] = []
        self._rows = 0
        self.changed = threading.Condition()  # notified on every request (the worker waits)

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
            self._pending.append(_Request(array, time.monotonic(), ticket))
            self._rows += array.shape[0]
            self.changed.notify_all()
            return self._ready_locked(time.monotonic())

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
            taken, total = [], 0
            while self._pending and total + len(self._pending[0].rows) <= self.max_batch_size:
                request = self._pending.pop(0)
                taken.append(request)
                total += len(request.rows)
            self._rows -= total
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
        data = np.full((rows, width) + tails.pop(), self.pad_value, dtype=dtype)
        mask = np.zeros((rows, width), dtype=bool)
        start = 0
        for request in taken:
            n, length = request.rows.shape[:2]
            data[start:start + n, :length] = request.rows
            mask[start:start + n, :length] = True
            start += n
        return PaddedBatch(data, mask, [len(r.rows) for r in taken],
                           [r.ticket for r in taken])
