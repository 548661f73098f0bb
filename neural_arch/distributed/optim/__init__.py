"""Distributed optimizers, at PyTorch's ``torch.distributed.optim`` path.

``ZeroRedundancyOptimizer`` (ZeRO stage 1, PyTorch's) shards the optimizer state over the
ranks of a data-parallel group under DDP's all-reduce: ``zero_redundancy`` holds the
optimizer, ``sharding`` how the parameters are split and how the updated shares are gathered
back. ``ReduceScatterZeroOptimizer`` (``reduce_scatter_zero``, the ``"zero1"`` strategy's) is
ZeRO-1 without DDP: it reduce-scatters the gradients over contiguous flat shards
(``flat_shards``) and all-gathers the updated shards, 2(N-1)/N of the model per step instead
of 3(N-1)/N. Both first check that every rank passed the same parameters (``same_parameters``).
``ZeroRedundancyOptimizer(overlap_with_ddp=True)`` steps inside DDP's communication hook
instead (``zero_overlap``: buckets dealt out by ``bucket_assignment``, stepped and broadcast
by ``overlap_step``).
"""
from __future__ import annotations

from .reduce_scatter_zero import ReduceScatterZeroOptimizer
from .zero_redundancy import ZeroRedundancyOptimizer

__all__ = ["ReduceScatterZeroOptimizer", "ZeroRedundancyOptimizer"]
