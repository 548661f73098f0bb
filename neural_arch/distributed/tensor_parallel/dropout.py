"""Dropout on one rank's part of an activation, with the dense model's mask.

Two activations of a tensor-parallel GPT are split across the group where dropout meets them:
the attention weights (each rank has its heads: dimension -3 of (batch, heads, T, T)) and,
under sequence parallelism, the residual stream between the sub-blocks (each rank has its
positions: dimension -2 of (batch, T, C)). Drawing each rank's mask from the global generator,
in step on every rank, would give every rank the same pattern; drawing from a generator seeded
per rank (Megatron-LM's way) gives a valid dropout, but not the dense model's.

Here each rank draws the uniforms of the whole dense activation from the global generator, in
the order and shapes the dense model draws them, and keeps its own heads or positions. The
masks are then exactly the dense model's under the same seed: a tensor-parallel GPT with
dropout trains as the dense GPT does, which the tests check, and activation checkpointing
replays them as it replays any draw of the global generator. The price is that every rank draws
as many uniforms as the dense model does (t times its share), not the time of any collective.
"""
from __future__ import annotations

from typing import Any, Optional

from ... import functional as F
from ...core.random import get_rng
from ...nn import Module
from ...nn._dtype import as_tensor
from ..group.world import ProcessGroup
from ._group import group_rank_size

__all__ = ["DenseDraws", "PartDropout"]


class DenseDraws:
    """What dropout's ``rng`` needs (``random(shape, dtype)``): the uniforms of the dense
    activation, this rank's ``size``-th part along ``dim`` of them."""

    def __init__(self, dim: int, rank: int, size: int) -> None:
        self.dim, self.rank, self.size = dim, rank, size

    def random(self, shape: tuple, dtype: Any) -> Any:
        generator = get_rng()
        if self.size == 1:
            return generator.random(shape, dtype=dtype)
        dense = list(shape)
        dense[self.dim] *= self.size
        draws = generator.random(tuple(dense), dtype=dtype)
        part = [slice(None)] * len(shape)
        length = shape[self.dim]
        part[self.dim] = slice(self.rank * length, (self.rank + 1) * length)
        return draws[tuple(part)]


class PartDropout(Module):
    """``Dropout`` for this rank's part (along ``dim``) of an activation split over ``group``:
    its mask is the dense activation's there (see the module docstring)."""

    def __init__(self, p: float, group: Optional[ProcessGroup], dim: int) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p, self.dim = float(p), int(dim)
        self.rank, self.size = group_rank_size(group)

    def forward(self, x: Any) -> Any:
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(as_tensor(x), self.p, True,
                         rng=DenseDraws(self.dim, self.rank, self.size))

    def extra_repr(self) -> str:
        return f"p={self.p}, dim={self.dim}, part {self.rank} of {self.size}"
