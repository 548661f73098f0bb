"""How a dense array maps onto the shards of a tensor-parallel group, and back.

A ``Layout`` names the dense dimension that is split across the ranks. Rank ``r`` of ``t``
holds the ``r``-th of ``t`` equal chunks of it. With ``stride`` > 1 the dimension packs
``stride`` equal blocks (attention's fused q | k | v), each split on its own: rank ``r`` holds
its chunk of every block, blocks in order. A contiguous slice of the packed dimension would give
rank 0 all of q and rank 1 the rest, and neither could run its heads alone.

The same layout shards a dense state (``shard``), rebuilds it from every rank's shard
(``unshard``) and tells a layer which dense shape its initialiser draws (``dense_shape``), so
that a checkpoint, a test and the initialisation agree on which rows belong to which rank.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence, Tuple

import numpy as np

from ...backends import xp_of


@dataclass(frozen=True)
class Layout:
    dim: int  # the dense dimension that is split across the ranks
    stride: int = 1  # the number of equal blocks that dimension packs, each split on its own

    def _check(self, length: int, size: int, what: str) -> int:
        if length % (self.stride * size):
            raise ValueError(f"{what}: dimension {self.dim} of length {length} does not split "
                             f"into {self.stride} block(s) x tensor-parallel size {size}")
        return length // (self.stride * size)

    def shard(self, dense: Any, rank: int, size: int) -> Any:
        """Rank ``rank``'s part of ``dense`` (a new contiguous array)."""
        xp = xp_of(dense)
        chunk = self._check(dense.shape[self.dim], size, f"sharding shape {tuple(dense.shape)}")
        block = chunk * size
        index = [slice(None)] * dense.ndim
        parts = []
        for b in range(self.stride):
            start = b * block + rank * chunk
            index[self.dim] = slice(start, start + chunk)
            parts.append(dense[tuple(index)])
        return xp.ascontiguousarray(parts[0] if len(parts) == 1
                                    else xp.concatenate(parts, axis=self.dim))

    def unshard(self, shards: Sequence[Any]) -> Any:
        """The dense array from every rank's shard, in rank order."""
        xp = xp_of(shards[0])
        if self.stride == 1:
            return xp.concatenate(list(shards), axis=self.dim)
        pieces = [xp.split(s, self.stride, axis=self.dim) for s in shards]
        return xp.concatenate([p[b] for b in range(self.stride) for p in pieces], axis=self.dim)

    def dense_shape(self, local_shape: Tuple[int, ...], size: int) -> Tuple[int, ...]:
        shape = list(local_shape)
        shape[self.dim] *= size
        return tuple(shape)


def shard_array(dense: Any, layout: Any, rank: int, size: int) -> Any:
    """``dense`` sharded by ``layout``; a replicated entry (layout None) is copied whole."""
    if layout is None:
        return np.array(dense, copy=True) if isinstance(dense, np.ndarray) else dense.copy()
    return layout.shard(dense, rank, size)
