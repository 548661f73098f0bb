"""Sequence parallelism (Korthikanti et al., 2022): what tensor parallelism leaves replicated,
split along the sequence instead.

Between the tensor-parallel sub-blocks, plain tensor parallelism has every rank compute the
LayerNorms, dropouts and residual adds on the whole (batch, time, C) activation, the same
values t times over, and keep them all for backward. With sequence parallelism each rank keeps
only its time/t positions there, and the communication changes shape, not volume: the
all-reduce after a row-parallel layer becomes a reduce-scatter along the sequence (each rank
keeps the summed rows of its own positions), and the column-parallel layer's input is
all-gathered along the sequence first (its backward reduce-scatters the input gradient, which
both sums the ranks' partial gradients and hands each rank its positions).

The sequence is the second-to-last dimension (time in (batch, time, C)); its length must divide
by the group size.

The replicated parameters used on a sequence shard (LayerNorm weight and bias, a row-parallel
bias, the position table) get from each rank the gradient of its own positions only: they enter
the computation through ``copy_to_tensor_parallel_region`` (identity forward, all-reduce of the
gradient backward), so after backward their gradients are whole and identical on every rank, as
without sequence parallelism. That is one small all-reduce per such parameter in backward.

Dropout on a sequence shard (``dropout.PartDropout``) keeps this rank's positions of the mask
the dense model draws, so the ranks' positions get the dense model's pattern.
"""
from __future__ import annotations

from typing import Any, Optional

from ... import functional as F
from ...backends import xp_of
from ...core.tensor import Tensor
from ...nn import Embedding, LayerNorm
from ...nn._dtype import as_tensor
from .. import collectives
from ..group.world import ProcessGroup
from ._group import group_rank_size
from .mappings import all_gather_along, autograd_collective, copy_to_tensor_parallel_region

__all__ = ["gather_from_sequence_parallel_region", "reduce_scatter_to_sequence_parallel_region",
           "scatter_to_sequence_parallel_region", "SequenceParallelLayerNorm",
           "SequenceParallelPositionEmbedding"]


def _check(array: Any, size: int, rank: int, op: str) -> int:
    if array.ndim < 2 or array.shape[-2] % size:
        raise ValueError(f"{op}: the sequence (second-to-last) dimension of shape "
                         f"{tuple(array.shape)} does not split over tensor-parallel size {size} "
                         f"(rank {rank})")
    return array.shape[-2] // size


def _reduce_scatter(array: Any, group: Optional[ProcessGroup], rank: int, size: int,
                    op: str) -> Any:
    _check(array, size, rank, op)
    xp = xp_of(array)
    chunks = xp.stack(xp.split(array, size, axis=-2))  # rank-major and contiguous
    out = xp.empty(chunks.shape[1:], dtype=chunks.dtype)
    collectives.reduce_scatter_tensor(out, chunks, group=group)
    return out


def _own(array: Any, rank: int, size: int, op: str) -> Any:
    chunk = _check(array, size, rank, op)
    return xp_of(array).ascontiguousarray(array[..., rank * chunk:(rank + 1) * chunk, :])


def gather_from_sequence_parallel_region(x: Any, group: Optional[ProcessGroup] = None
                                         ) -> Tensor:
    """All-gather along the sequence forward; reduce-scatter of the gradient backward."""
    def forward(array: Any, rank: int, size: int) -> Any:
        _check(array, 1, rank, "gather_from_sequence_parallel_region")
        return all_gather_along(array, group, size, -2)

    op = "gather_from_sequence_parallel_region backward"
    return autograd_collective(x, group, forward,
                               lambda g, rank, size: _reduce_scatter(g, group, rank, size, op))


def reduce_scatter_to_sequence_parallel_region(x: Any, group: Optional[ProcessGroup] = None
                                               ) -> Tensor:
    """Sum over the ranks, each keeping its positions, forward; all-gather backward."""
    op = "reduce_scatter_to_sequence_parallel_region"
    return autograd_collective(
        x, group, lambda array, rank, size: _reduce_scatter(array, group, rank, size, op),
        lambda g, rank, size: all_gather_along(g, group, size, -2))


def scatter_to_sequence_parallel_region(x: Any, group: Optional[ProcessGroup] = None) -> Tensor:
    """This rank's positions of a replicated activation forward; all-gather backward."""
    op = "scatter_to_sequence_parallel_region"
    return autograd_collective(x, group, lambda array, rank, size: _own(array, rank, size, op),
                               lambda g, rank, size: all_gather_along(g, group, size, -2))


def _whole_gradient(param: Optional[Tensor], group: Optional[ProcessGroup]) -> Optional[Tensor]:
    return None if param is None else copy_to_tensor_parallel_region(param, group)


class SequenceParallelLayerNorm(LayerNorm):
    """``LayerNorm`` on this rank's positions; its parameters are replicated and their
    gradients summed over the group (the module docstring says why)."""

    def __init__(self, normalized_shape: Any, group: Optional[ProcessGroup] = None,
                 **kwargs: Any) -> None:
        super().__init__(normalized_shape, **kwargs)
        self.group = group
        group_rank_size(group)

    def forward(self, x: Any) -> Tensor:
        return F.layer_norm(as_tensor(x), self.normalized_shape,
                            _whole_gradient(self.weight, self.group),
                            _whole_gradient(self.bias, self.group), self.eps)


class SequenceParallelPositionEmbedding(Embedding):
    """A replicated position table that looks up only this rank's positions: given all the
    positions (time,), it returns the rows of the rank's time/t of them."""

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 group: Optional[ProcessGroup] = None, **kwargs: Any) -> None:
        super().__init__(num_embeddings, embedding_dim, **kwargs)
        self.group = group
        self.tp_rank, self.tp_size = group_rank_size(group)

    def forward(self, positions: Any) -> Tensor:
        pos = positions.array if isinstance(positions, Tensor) else positions
        if pos.shape[-1] % self.tp_size:
            raise ValueError(f"sequence parallelism splits the sequence: length "
                             f"{pos.shape[-1]} is not divisible by the tensor-parallel size "
                             f"{self.tp_size}")
        chunk = pos.shape[-1] // self.tp_size
        mine = pos[..., self.tp_rank * chunk:(self.tp_rank + 1) * chunk]
        return F.embedding(mine, _whole_gradient(self.weight, self.group))
