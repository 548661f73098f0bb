"""The communication of tensor parallelism as autograd operators (Megatron's f and g).

A column-parallel layer needs its full input on every rank, and the gradient of that input is
the sum of every rank's partial gradient: ``copy_to_tensor_parallel_region`` (f) is the
identity forward and an all-reduce backward. A row-parallel layer leaves every rank with a
partial sum of the output: ``reduce_from_tensor_parallel_region`` (g) all-reduces it forward,
and since each rank's output is the same sum, the gradient passes through unchanged. The two
are conjugate: between an f and a g, every rank works on its own shard with no communication.

``gather_from_tensor_parallel_region`` and ``scatter_to_tensor_parallel_region`` move between a
full last dimension and this rank's chunk of it (all-gather forward and take-own-slice backward,
and the reverse).

Every collective runs on a fresh contiguous copy: the arrays handed in (an input's data, an
output gradient) may be views that other nodes still read. The backward collectives run in the
order the engine reaches the nodes, which is the same on every rank, as the graphs are.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from ...backends import xp_of
from ...core.tensor import Tensor, make_result
from ...nn._dtype import as_tensor
from .. import collectives
from ..group.world import ProcessGroup
from ._group import group_rank_size

__all__ = ["copy_to_tensor_parallel_region", "reduce_from_tensor_parallel_region",
           "gather_from_tensor_parallel_region", "scatter_to_tensor_parallel_region"]


def _all_reduce(array: Any, group: Optional[ProcessGroup]) -> Any:
    out = xp_of(array).array(array, copy=True, order="C")
    collectives.all_reduce(out, group=group)
    return out


def all_gather_along(array: Any, group: Optional[ProcessGroup], size: int, axis: int) -> Any:
    """Every rank's ``array`` concatenated along ``axis``, in rank order (the last dimension
    for the tensor-parallel regions, the sequence for the sequence-parallel ones)."""
    xp = xp_of(array)
    local = xp.ascontiguousarray(array)
    out = xp.empty((size,) + tuple(local.shape), dtype=local.dtype)
    collectives.all_gather_into_tensor(out, local, group=group)
    return xp.concatenate(list(out), axis=axis)


def _own_chunk(array: Any, rank: int, size: int, op: str) -> Any:
    last = array.shape[-1] if array.ndim else 0
    if array.ndim == 0 or last % size:
        raise ValueError(f"{op}: the last dimension of shape {tuple(array.shape)} does not split "
                         f"over tensor-parallel size {size} (rank {rank})")
    chunk = last // size
    return array[..., rank * chunk:(rank + 1) * chunk]


def autograd_collective(x: Any, group: Optional[ProcessGroup],
                        forward: Callable[[Any, int, int], Any],
                        backward: Callable[[Any, int, int], Any]) -> Tensor:
    """``x`` through an autograd operator that communicates over ``group``: ``forward(array,
    rank, size)`` gives the output's array and ``backward(grad, rank, size)`` the input's
    gradient. On a group of one process both are the identity, so ``x`` itself comes back."""
    x = as_tensor(x)
    rank, size = group_rank_size(group)
    if size == 1:
        return x
    return make_result(forward(x.array, rank, size), (x,),
                       lambda g: (backward(g, rank, size),))


def copy_to_tensor_parallel_region(x: Any, group: Optional[ProcessGroup] = None) -> Tensor:
    """Identity forward; all-reduce (sum) of the gradient backward."""
    return autograd_collective(x, group, lambda array, rank, size: array,
                               lambda g, rank, size: _all_reduce(g, group))


def reduce_from_tensor_parallel_region(x: Any, group: Optional[ProcessGroup] = None) -> Tensor:
    """All-reduce (sum) forward; the gradient passes through unchanged."""
    return autograd_collective(x, group, lambda array, rank, size: _all_reduce(array, group),
                               lambda g, rank, size: g)


def gather_from_tensor_parallel_region(x: Any, group: Optional[ProcessGroup] = None) -> Tensor:
    """All-gather of the last dimension forward; backward keeps this rank's chunk."""
    def forward(array: Any, rank: int, size: int) -> Any:
        if array.ndim == 0:
            raise ValueError(f"gather_from_tensor_parallel_region needs a last dimension, got "
                             f"shape {tuple(array.shape)}")
        return all_gather_along(array, group, size, -1)

    op = "gather_from_tensor_parallel_region backward"
    return autograd_collective(x, group, forward,
                               lambda g, rank, size: _own_chunk(g, rank, size, op))


def scatter_to_tensor_parallel_region(x: Any, group: Optional[ProcessGroup] = None) -> Tensor:
    """This rank's chunk of the last dimension forward; all-gather of the gradient backward."""
    def forward(array: Any, rank: int, size: int) -> Any:
        chunk = _own_chunk(array, rank, size, "scatter_to_tensor_parallel_region")
        return xp_of(chunk).ascontiguousarray(chunk)

    return autograd_collective(x, group, forward,
                               lambda g, rank, size: all_gather_along(g, group, size, -1))
