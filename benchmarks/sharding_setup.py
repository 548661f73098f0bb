"""The model and the four data-parallel strategies that ``bench_memory`` and ``bench_sharding``
compare: one GPT (float32, Adam) wrapped by DDP, DDP + ZeRO-1, or FSDP (ZeRO-2/3, each
transformer block a unit)."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

STRATEGIES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")


def gpt(job: Dict[str, Any]):
    """The job's GPT, the same weights on every call."""
    from neural_arch.core import manual_seed
    from neural_arch.models.gpt import GPT, GPTConfig
    manual_seed(0)
    return GPT(GPTConfig(block_size=job["block"], vocab_size=job["vocab"], n_layer=job["layers"],
                         n_head=job["heads"], n_embd=job["width"]))


def build(strategy: str, job: Dict[str, Any], bucket_views: bool = False,
          shared_buckets: Optional[bool] = None, lr: float = 1e-3) -> Tuple[Any, Any, Any]:
    """(wrapped model, optimizer, the FSDP wrapper or None). ``bucket_views``: DDP's gradients
    and ZeRO-1's parameters are views of their flat buffers (the memory-minded settings, which
    need private buckets); ``shared_buckets`` is DDP's."""
    from neural_arch import distributed as dist
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ModuleWrapPolicy
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.models.gpt import Block
    from neural_arch.optim import Adam
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; choose from {STRATEGIES}")
    model = gpt(job)
    if strategy in ("DDP", "ZeRO-1"):
        ddp = dist.DistributedDataParallel(
            model, shared_buckets=False if bucket_views else shared_buckets,
            gradient_as_bucket_view=bucket_views)
        if strategy == "DDP":
            return ddp, Adam(ddp.parameters(), lr=lr), None
        return ddp, ZeroRedundancyOptimizer(ddp.parameters(), Adam,
                                            parameters_as_bucket_view=bucket_views, lr=lr), None
    fsdp = FullyShardedDataParallel(
        model, sharding_strategy="FULL_SHARD" if strategy == "ZeRO-3" else "SHARD_GRAD_OP",
        auto_wrap_policy=ModuleWrapPolicy({Block}))
    return fsdp, Adam(fsdp.parameters(), lr=lr), fsdp
