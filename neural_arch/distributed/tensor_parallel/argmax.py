"""The argmax over a vocabulary split across ranks (a language model's predicted tokens),
without gathering the logits.

Each rank holds the logits of its V/t vocabulary entries (rank r: ``[r*V/t, (r+1)*V/t)``). Its
largest logit and that entry's global index per row; an all-reduce (max) of the values; then
each rank offers its index where its value is the maximum, and an all-reduce (min) of the
offers picks the lowest global index among equal maxima, as ``argmax`` on the gathered
logits does. Two all-reduces of one number per row: the (rows, V) array is never built.
"""
from __future__ import annotations

from typing import Any, Optional

from ...backends import xp_of
from ...core.tensor import Tensor
from .. import collectives
from ..group.world import ProcessGroup
from ..reduce_ops import ReduceOp
from ._group import group_rank_size

__all__ = ["vocab_parallel_argmax"]


def vocab_parallel_argmax(logits: Any, group: Optional[ProcessGroup] = None) -> Any:
    """Integer ids (...) of the full vocabulary's largest logit, from this rank's shard
    ``logits`` (..., V/t); every rank of ``group`` must call it, and all get the same ids."""
    data = logits.array if isinstance(logits, Tensor) else logits
    if data.ndim < 1 or data.shape[-1] < 1:
        raise ValueError(f"vocab_parallel_argmax: logits need a non-empty vocabulary "
                         f"dimension, got shape {tuple(data.shape)}")
    rank, size = group_rank_size(group)
    xp = xp_of(data)
    per_rank = data.shape[-1]
    rows = data.reshape(-1, per_rank)
    local = rows.argmax(axis=1)
    index = local.astype(xp.int64) + rank * per_rank
    if size > 1:
        best = xp.ascontiguousarray(rows[xp.arange(rows.shape[0]), local])
        top = best.copy()
        collectives.all_reduce(top, op=ReduceOp.MAX, group=group)
        # ranks without the maximum offer V, above every real index
        index = xp.ascontiguousarray(xp.where(best == top, index, per_rank * size))
        collectives.all_reduce(index, op=ReduceOp.MIN, group=group)
    return index.reshape(data.shape[:-1])
