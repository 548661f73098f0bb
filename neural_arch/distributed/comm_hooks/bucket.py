"""What a communication hook receives: ``GradBucket``; it returns a ``work.Future``.

A hook is ``hook(state, bucket) -> Future`` (PyTorch's ``DistributedDataParallel.
register_comm_hook``). ``bucket.buffer()`` is the flat array of this rank's local gradients of
the bucket's parameters, not yet combined with the other ranks; the hook returns a future of the
array DDP then writes into those gradients: the average over the group, or an approximation
of it.

A future resolves when waited for (see ``work.Future``); DDP waits for its buckets in bucket
order on every rank, so collectives a hook issues from a later step of its future (PowerSGD's
second all-reduce, say) are issued in the same order everywhere, as the collectives require.
"""
from __future__ import annotations

from typing import List, Sequence

import numpy as np


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
        return [self._buffer[lo:hi].reshape(p.array.shape) for p, lo, hi in
                zip(self._parameters, self._offsets[:-1], self._offsets[1:])]

    def parameters(self) -> list:
        return list(self._parameters)

    def is_last(self) -> bool:
        """The last bucket of the step: hooks count their steps on it."""
        return self._is_last

    def __repr__(self) -> str:
        return (f"GradBucket(index={self._index}, {len(self._parameters)} parameters, "
                f"{self._buffer.size} x {self._buffer.dtype})")
