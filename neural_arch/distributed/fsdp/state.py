"""Whole-model views of sharded units: full parameters on demand, full state dicts, the flat
shards with their layout (for sharded checkpoints), and clipping by the global norm.

``summon_full_params`` gathers each unit's shards in the parameters' own dtype (float32
masters under mixed precision, not the float16 compute copy) into a temporary vector and
points the parameters at it; with ``writeback`` this rank's slice of it is copied back into
the shard on exit, so loading a state dict is writing into summoned parameters.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any, Iterator, List, Sequence, Tuple

import numpy as np

from ...nn import Parameter
from .. import collectives
from ..reduce_ops import ReduceOp
from .flat_param import FlatEntry, GatherStats
from .unit import Unit


@dataclass(frozen=True)
class FlatShard:
    """One unit's flat parameter as this rank holds it.

    ``unit``: the dotted name of the unit's module ("" for the root); ``shard``: the Parameter
    the optimizer steps (``padded_numel / world`` elements, this rank's slice
    ``[rank * len(shard), (rank + 1) * len(shard))`` of the padded flat vector; under NO_SHARD
    the whole vector); ``numel``: elements of parameters (the rest is zero padding);
    ``entries``: each parameter's fully qualified name, shape and offset in the unpadded flat
    vector, which does not depend on the world size.
    """

    unit: str
    shard: Parameter
    numel: int
    padded_numel: int
    shard_offset: int
    entries: Tuple[FlatEntry, ...]


def flat_shards(units: Sequence[Unit]) -> List[FlatShard]:
    return [FlatShard(u.name, u.shard, u.layout.numel, u.layout.padded_numel, u.lo,
                      tuple(u.layout.entries)) for u in units]


def load_flat(unit: Unit, full_flat: Any) -> None:
    """Set the unit's shard from its full flat vector (unpadded or padded, any float dtype)."""
    flat = np.asarray(full_flat).reshape(-1)
    if flat.size not in (unit.layout.numel, unit.layout.padded_numel):
        raise ValueError(f"FullyShardedDataParallel.load_flat({unit.name!r}): the unit's flat "
                         f"vector has {unit.layout.numel} elements ({unit.layout.padded_numel} "
                         f"padded), got {flat.size}")
    padded = np.zeros(unit.layout.padded_numel, dtype=unit.master_dtype)
    padded[:unit.layout.numel] = flat[:unit.layout.numel]
    unit.shard.array[...] = padded[unit.lo:unit.hi]
    unit.stats.generation += 1


@contextlib.contextmanager
def summon_full_params(units: Sequence[Unit], stats: GatherStats,
                       writeback: bool = True) -> Iterator[None]:
    summoned = []
    try:
        for unit in units:
            unit.wait_gather()
            full = unit.gather_master()
            summoned.append((unit, full, [p.array for p in unit.params]))
            stats.add(full.nbytes)
            for param, view in zip(unit.params, unit.layout.views(full)):
                param.array = view
        yield
    finally:
        for unit, full, compute_views in summoned:
            for param, view in zip(unit.params, compute_views):
                param.array = view
            stats.remove(full.nbytes)
            if writeback:
                unit.shard.array[...] = full[unit.lo:unit.hi]
        if writeback and summoned:
            stats.generation += 1  # the next forward gathers what was written


def clip_grad_norm_(units: Sequence[Unit], group: Any, sharded: bool, max_norm: float,
                    norm_type: float = 2.0) -> np.float64:
    """Scale the shards' gradients so the norm of the whole model's gradient is at most
    ``max_norm``; returns that norm before clipping. Equal to ``optim.clip_grad_norm_`` on
    the unsharded model: the shards' contributions are combined over the ranks (padding is
    zero and adds nothing)."""
    norm_type = float(norm_type)
    grads = [u.shard.grad.array for u in units if u.shard.grad is not None]
    if norm_type == math.inf:
        local = max((float(np.abs(g).max()) for g in grads if g.size), default=0.0)
        op = ReduceOp.MAX
    else:
        local = sum(float((np.abs(g.astype(np.float64)) ** norm_type).sum()) for g in grads)
        op = ReduceOp.SUM
    value = np.array([local], dtype=np.float64)
    if sharded:
        collectives.all_reduce(value, op, group=group)
    total = float(value[0]) if norm_type == math.inf else float(value[0]) ** (1.0 / norm_type)
    coef = float(max_norm) / (total + 1e-6)
    if not coef >= 1.0:
        for grad in grads:
            grad *= coef
    return np.float64(total)
