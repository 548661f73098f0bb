"""The collectives with a root rank: ``reduce`` into one rank, ``gather`` to one rank,
``scatter`` from one rank (PyTorch's signatures; the ``collectives`` package re-exports them).

Only the root passes or receives the per-rank list: the other ranks pass None (or nothing), and
a list given there raises, naming the rank, instead of being silently ignored.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence

import numpy as np

from .. import algorithms
from ..buffers import Flat, checked_array
from .args import tensor_list, unpack_blocks, usable_group
from ..group.world import ProcessGroup
from ..reduce_ops import OP_CODE, ReduceOp, as_reduce_op, finish_average


def _summing(op: ReduceOp) -> ReduceOp:
    """The tree reduce adds; its AVERAGE is divided once at the end (``finish_average``).
    ``all_reduce`` and ``reduce_scatter`` hand AVERAGE to the algorithm layer instead."""
    return ReduceOp.SUM if op is ReduceOp.AVERAGE else op


def _no_list_off_root(items: Any, what: str, pg: ProcessGroup, root_arg: str, root: int) -> None:
    if items:
        raise ValueError(f"{what} must be None on rank {pg.global_rank}: only the {root_arg} "
                         f"rank {pg.ranks[root]} passes one")


def reduce(tensor: Any, dst: int = 0, op: Any = ReduceOp.SUM,
           group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Reduce into ``tensor`` of rank ``dst``; other ranks' tensors are left unchanged."""
    pg = usable_group(group, "reduce")
    op = as_reduce_op(op)
    root = pg.group_rank_of(dst, "dst")
    arr = checked_array(tensor, "reduce tensor", op, writable=pg.rank == root)
    fp = pg.fingerprint(f"reduce:{OP_CODE[op]}:{root}", arr.dtype, arr.size)

    def run():
        flat = Flat(arr)
        algorithms.reduce(pg.transport, flat.buf, root, _summing(op), fp)
        if pg.rank == root:
            finish_average(flat.buf, op, pg.size)
            flat.commit()
        return tensor
    return pg.run(run, async_op, fp, "reduce")


def gather(tensor: Any, gather_list: Optional[list] = None, dst: int = 0,
           group: Optional[ProcessGroup] = None, async_op: bool = False):
    """Rank ``dst`` gets every rank's ``tensor``: into ``gather_list``, or a new list it returns.
    Other ranks return None."""
    pg = usable_group(group, "gather")
    root = pg.group_rank_of(dst, "dst")
    arr = checked_array(tensor, "gather tensor")
    outputs = None
    if pg.rank == root and gather_list is not None:
        outputs = tensor_list(gather_list, "gather_list", arr, pg.size)
    elif pg.rank != root:
        _no_list_off_root(gather_list, "gather_list", pg, "dst", root)
    fp = pg.fingerprint(f"gather:{root}", arr.dtype, arr.size)

    def run():
        is_root = pg.rank == root
        collected = np.empty(pg.size * arr.size, dtype=arr.dtype) if is_root else None
        algorithms.gather(pg.transport, Flat(arr).buf, collected, root, fp)
        if not is_root:
            return None
        return unpack_blocks(collected.reshape(pg.size, *arr.shape), outputs, tensor,
                             gather_list)
    return pg.run(run, async_op, fp, "gather")


def scatter(tensor: Any, scatter_list: Optional[Sequence] = None, src: int = 0,
            group: Optional[ProcessGroup] = None, async_op: bool = False):
    """``tensor`` of rank r gets ``scatter_list[r]`` of rank ``src``; returns ``tensor``."""
    pg = usable_group(group, "scatter")
    root = pg.group_rank_of(src, "src")
    arr = checked_array(tensor, "scatter tensor", writable=True)
    inputs = None
    if pg.rank == root:
        if scatter_list is None:
            raise ValueError(f"scatter needs scatter_list on the src rank {src}")
        inputs = tensor_list(scatter_list, "scatter_list", arr, pg.size, False)
    else:
        _no_list_off_root(scatter_list, "scatter_list", pg, "src", root)
    fp = pg.fingerprint(f"scatter:{root}", arr.dtype, arr.size)

    def run():
        send = np.concatenate([Flat(a).buf for a in inputs]) if inputs is not None else None
        flat = Flat(arr)
        algorithms.scatter(pg.transport, send, flat.buf, root, fp)
        flat.commit()
        return tensor
    return pg.run(run, async_op, fp, "scatter")


__all__ = ["gather", "reduce", "scatter"]
