"""The simplest data parallelism there is, kept for reading rather than for speed.

Each rank runs the same model on its own slice of the batch. Before the optimizer step, every
gradient is averaged over the ranks with one all-reduce per parameter, so all replicas take the
same step and stay identical. ``DistributedDataParallel`` (data_parallel.py) does the same with a few large
bucketed messages and can overlap them with backward; this class shows the idea in ten lines.
"""
from __future__ import annotations

from .. import collectives
from ..reduce_ops import ReduceOp


class NaiveDistributedDataParallel:
    def __init__(self, module) -> None:
        self.module = module
        for p in module.parameters():  # start from rank 0's weights everywhere
            collectives.broadcast(p.array, src=0)

    def __call__(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def parameters(self):
        return self.module.parameters()

    def sync_gradients(self) -> None:
        for p in self.module.parameters():
            if p.grad is not None:
                collectives.all_reduce(p.grad.array, ReduceOp.AVERAGE)
