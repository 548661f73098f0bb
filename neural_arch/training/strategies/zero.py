"""``ZeroOne`` ("zero1"): DDP's gradients, the optimizer state sharded over the group.

Each rank keeps the optimizer state of its share of the parameters only
(``ZeroRedundancyOptimizer``); after the step the updated shares are all-gathered.
"""
from __future__ import annotations

from .wrapped import WrappedStep


class ZeroOne(WrappedStep):
    name = "zero1"
    zero_stage = 1
