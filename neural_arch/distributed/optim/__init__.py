"""Distributed optimizers, at PyTorch's ``torch.distributed.optim`` path.

``ZeroRedundancyOptimizer`` (ZeRO stage 1) shards the optimizer state over the ranks of a
data-parallel group: ``zero_redundancy`` holds the optimizer, ``sharding`` how the parameters
are split and how the updated shares are gathered back.
"""
from __future__ import annotations

from .zero_redundancy import ZeroRedundancyOptimizer

__all__ = ["ZeroRedundancyOptimizer"]
