"""Cross-entropy over a vocabulary split across ranks, without gathering the logits.

Each rank holds the logits of its V/t vocabulary entries. The loss of a row needs the full
vocabulary's log-sum-exp and the target's logit, both sums over the vocabulary, so each is
computed locally and summed: an all-reduce (max) of the row maxima first, for a stable
exponent; then one all-reduce (sum) of a buffer holding both the local sums of exponentials
and the target logit (which only the rank holding the target contributes). A rank never sees
more than (rows, V/t) logits: the full (rows, V) array, the largest activation of a language
model, is never built.

Backward is local: d loss / d logit = softmax - onehot(target), and the softmax of this rank's
entries needs only its exponentials and the summed denominator, already at hand.
"""
from __future__ import annotations

from typing import Any, Optional

from ...backends import xp_of
from ...core.tensor import Tensor, make_result
from .. import collectives
from ..group.world import ProcessGroup
from ..reduce_ops import ReduceOp
from ._group import group_rank_size

__all__ = ["vocab_parallel_cross_entropy"]


def _targets(target: Any, logits: Any, ignore_index: int, vocab: int, rank: int, size: int):
    xp = xp_of(logits)
    t = target.array if isinstance(target, Tensor) else xp.asarray(target)
    if t.dtype.kind not in "iu":
        raise TypeError(f"vocab_parallel_cross_entropy: target must hold integer class ids, "
                        f"got dtype {t.dtype}")
    if tuple(t.shape) != tuple(logits.shape[:-1]):
        raise ValueError(f"vocab_parallel_cross_entropy: target shape {tuple(t.shape)} does not "
                         f"match logits shape {tuple(logits.shape)} (expected "
                         f"{tuple(logits.shape[:-1])}; logits are (..., V/t), tp={size}, "
                         f"rank {rank})")
    t = t.reshape(-1).astype(xp.int64)
    valid = t != ignore_index
    bad = valid & ((t < 0) | (t >= vocab))
    if bool(bad.any()):
        raise ValueError(f"vocab_parallel_cross_entropy: target value {int(t[bad][0])} is out "
                         f"of range for {vocab} classes (V/t={vocab // size} x tp={size}, "
                         f"ignore_index={ignore_index})")
    return t, valid


def vocab_parallel_cross_entropy(logits: Any, target: Any, group: Optional[ProcessGroup] = None,
                                 ignore_index: int = -1) -> Tensor:
    """Mean cross-entropy over the non-ignored targets of the full vocabulary, from this rank's
    shard ``logits`` (..., V/t) (rank r holds entries ``[r*V/t, (r+1)*V/t)``) and integer
    ``target`` (...) ids of the full vocabulary. Equals ``cross_entropy`` on the gathered
    logits; the gradient reaches each rank's shard."""
    logits = logits if isinstance(logits, Tensor) else Tensor(logits)
    ld = logits.array
    rank, size = group_rank_size(group)
    if ld.ndim < 1 or ld.dtype.kind != "f":
        raise ValueError(f"vocab_parallel_cross_entropy: logits must be floating with a "
                         f"vocabulary dimension, got shape {tuple(ld.shape)} and dtype {ld.dtype}")
    xp = xp_of(ld)
    per_rank = ld.shape[-1]
    t, valid = _targets(target, ld, ignore_index, per_rank * size, rank, size)
    z = ld.reshape(-1, per_rank)
    rows = xp.arange(z.shape[0])

    row_max = xp.ascontiguousarray(z.max(axis=1))
    if size > 1:
        collectives.all_reduce(row_max, op=ReduceOp.MAX, group=group)
    z = z - row_max[:, None]  # the max is a constant of the loss: no gradient through it
    local_t = t - rank * per_rank
    here = valid & (local_t >= 0) & (local_t < per_rank)
    local_t = xp.where(here, local_t, 0)
    e = xp.exp(z)
    sums = xp.stack([e.sum(axis=1), xp.where(here, z[rows, local_t], 0.0)])
    if size > 1:
        collectives.all_reduce(sums, group=group)  # sum of exponentials and the target logit
    total, picked = sums[0], sums[1]
    per_item = xp.where(valid, xp.log(total) - picked, 0.0)
    count = int(valid.sum())
    loss = per_item.sum() / count

    def backward(g: Any) -> tuple:
        scale = g / count
        grad = e * (scale / total)[:, None]
        grad[rows[here], local_t[here]] -= scale
        grad *= valid[:, None]
        return (grad.reshape(ld.shape).astype(ld.dtype, copy=False),)

    return make_result(xp.asarray(loss, dtype=ld.dtype), (logits,), backward)
