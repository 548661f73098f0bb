"""``ZeroOne`` ("zero1"): ZeRO stage 1 as DeepSpeed runs it, the optimizer state sharded.

Each rank keeps the optimizer state of a contiguous 1/N of the flattened parameters
(``ReduceScatterZeroOptimizer``). There is no DDP: backward leaves the gradients local, the
window's sync reduce-scatters them (each rank receives the average of its shard), the norm for
clipping is summed over the shards, and after the step the updated shards are all-gathered:
2(N-1)/N of the model per step, where DDP plus ``ZeroRedundancyOptimizer`` moves 3(N-1)/N.
The reduce-scatter runs after backward (``overlap`` does not apply). The flat buffer is host
memory: a model on a GPU runs ZeRO-1 as DDP plus ``ZeroRedundancyOptimizer`` instead (the same
updates, 3(N-1)/N of the model per step).
"""
from __future__ import annotations

from .wrapped import WrappedStep


class ZeroOne(WrappedStep):
    name = "zero1"
    zero_stage = 1
    reduce_scatter = True
