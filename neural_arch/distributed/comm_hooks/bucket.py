"""What a communication hook receives and returns: ``GradBucket`` and ``Future``.

A hook is ``hook(state, bucket) -> Future`` (PyTorch's ``DistributedDataParallel.
register_comm_hook``). ``bucket.buffer()`` is the flat array of this rank's local gradients of
the bucket's parameters, not yet combined with the other ranks; the hook returns a future of the
array DDP then writes into those gradients: the average over the group, or an approximation
of it.

A ``Future`` resolves lazily: ``wait()`` runs the steps still to do (waiting for a collective,
then whatever ``then`` chained after it) on the caller's thread, once, and keeps the value.
DDP waits for its buckets in bucket order on every rank, so collectives issued from such later
steps are issued in the same order everywhere, which the collectives require.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence

import numpy as np

_PENDING = object()


class Future:
    """The result of a communication hook, as ``torch.futures.Future``: ``wait()``,
    ``value()``, ``done()``, ``then(callback)``."""

    def __init__(self, resolve: Callable[[], Any]) -> None:
        self._resolve: Optional[Callable[[], Any]] = resolve
        self._value: Any = _PENDING
        self._error: Optional[BaseException] = None

    @classmethod
    def completed(cls, value: Any) -> "Future":
        future = cls(lambda: value)
        future.wait()
        return future

    @classmethod
    def after(cls, work, value: Any) -> "Future":
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


class GradBucket:
    """One DDP bucket as a hook sees it (PyTorch's ``dist.GradBucket``)."""

    def __init__(self, index: int, buffer: np.ndarray, parameters: Sequence,
                 offsets: Sequence[int], is_last: bool) -> None:
        self._index, self._buffer, self._is_last = index, buffer, is_last
        self._parameters = list(parameters)
        self._offsets = list(offsets)

    def index(self) -> int:
        """Position of the bucket; every rank has the same buckets in the same order."""
        return self._index

    def buffer(self) -> np.ndarray:
        """The flat 1-D array of this rank's gradients; a hook may change it in place."""
        return self._buffer

    def set_buffer(self, buffer: np.ndarray) -> None:
        if buffer.shape != self._buffer.shape:
            raise ValueError(f"GradBucket {self._index}: set_buffer needs shape "
                             f"{self._buffer.shape}, got {buffer.shape}")
        self._buffer[...] = buffer

    def gradients(self) -> List[np.ndarray]:
        """Views of the buffer shaped like each parameter (writing them writes the buffer)."""
        return [self._buffer[lo:hi].reshape(p.data.shape) for p, lo, hi in
                zip(self._parameters, self._offsets[:-1], self._offsets[1:])]

    def parameters(self) -> list:
        return list(self._parameters)

    def is_last(self) -> bool:
        """The last bucket of the step: hooks count their steps on it."""
        return self._is_last

    def __repr__(self) -> str:
        return (f"GradBucket(index={self._index}, {len(self._parameters)} parameters, "
                f"{self._buffer.size} x {self._buffer.dtype})")
