"""Top-k sparsification with error feedback (Stich et al. 2018; Lin et al. 2018, "Deep
Gradient Compression").

Per bucket of n gradients, each rank adds the residual it kept from the last step, sends only
its k = ceil(ratio x n) entries of largest magnitude (index and value), and keeps the rest as
the new residual, so nothing is lost, only delayed. The k pairs of every rank are exchanged
with one all-gather of fixed size (k is the same everywhere) and summed into the dense
average, in rank order, so every rank computes the same result.

Index and value travel in one message of int32 words: k int32 indices, then the k values'
bytes (padded to whole words). A bucket's indices must fit int32 (n < 2**31).
"""
from __future__ import annotations

import math
from typing import Dict, Optional

import numpy as np

from ...backends.numba_kernels import topk_compress
from .. import collectives
from ..group.process_group import ProcessGroup
from ..work import Future
from .bucket import GradBucket
from .default_hooks import CommHookState, hook_group

_INDEX = np.dtype(np.int32)


class TopKState(CommHookState):
    """``ratio``: the share of each bucket's entries a rank sends, in (0, 1]."""

    def __init__(self, ratio: float, process_group: Optional[ProcessGroup] = None) -> None:
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float, np.floating)) \
                or not 0 < ratio <= 1:
            raise ValueError(f"TopKState ratio must be a number in (0, 1], got {ratio!r}")
        super().__init__(process_group)
        self.ratio = float(ratio)
        self.residuals: Dict[int, np.ndarray] = {}  # bucket -> what was not sent yet

    def k(self, n: int) -> int:
        return min(n, max(1, math.ceil(self.ratio * n)))


def _pack(indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """k indices then k values, as whole int32 words."""
    index_bytes = indices.size * _INDEX.itemsize
    words = -(-(index_bytes + values.nbytes) // _INDEX.itemsize)
    message = np.zeros(words, dtype=_INDEX)
    raw = message.view(np.uint8)
    raw[:index_bytes] = indices.astype(_INDEX).view(np.uint8)
    raw[index_bytes:index_bytes + values.nbytes] = values.view(np.uint8)
    return message


def _unpack(gathered: np.ndarray, k: int, dtype: np.dtype) -> tuple:
    """Every rank's (indices, values), rank after rank, from the gathered messages."""
    raw = gathered.view(np.uint8).reshape(gathered.shape[0], -1)
    index_bytes = k * _INDEX.itemsize
    indices = np.ascontiguousarray(raw[:, :index_bytes]).view(_INDEX).reshape(-1)
    values = np.ascontiguousarray(raw[:, index_bytes:index_bytes + k * dtype.itemsize])
    return indices, values.view(dtype).reshape(-1)


def topk_hook(state: TopKState, bucket: GradBucket) -> Future:
    """The average over the group of each rank's top-k entries (plus residual)."""
    pg = hook_group(state)
    flat, index = bucket.buffer(), bucket.index()
    if flat.size >= 2 ** 31:
        raise ValueError(f"topk_hook: bucket {index} has {flat.size} entries; indices are "
                         "int32, so buckets must stay below 2**31 entries")
    residual = state.residuals.get(index)
    if residual is not None:
        flat += residual
    k = state.k(flat.size)
    indices, values = topk_compress(flat, k)
    residual = flat.copy()
    residual[indices] = 0  # exactly what was not sent
    state.residuals[index] = residual
    message = _pack(indices, values)
    gathered = np.empty((pg.size, message.size), dtype=message.dtype)
    work = collectives.all_gather_into_tensor(gathered, message, group=pg, async_op=True)
    state.record(message.nbytes)
    state.maybe_increase_iter(bucket)

    def finish() -> np.ndarray:
        work.wait()
        every_index, every_value = _unpack(gathered, k, flat.dtype)
        # bincount adds in float64, in rank order: the same sum on every rank
        total = np.bincount(every_index, weights=every_value, minlength=flat.size)
        np.divide(total, pg.size, out=flat, casting="same_kind")
        return flat
    return Future(finish)

