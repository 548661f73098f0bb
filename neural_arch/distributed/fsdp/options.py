"""The choices of ``FullyShardedDataParallel``: how much is sharded, and in which precision.

``ShardingStrategy`` (torch's names):
- ``FULL_SHARD`` (ZeRO-3): parameters, gradients and optimizer state are sharded; a unit's
  full parameters exist only while its forward or backward runs.
- ``SHARD_GRAD_OP`` (ZeRO-2): gradients and optimizer state are sharded; full parameters are
  gathered at each forward and then kept until the next one.
- ``NO_SHARD``: every rank keeps everything (DistributedDataParallel's memory); gradients
  are all-reduced.

``MixedPrecision``: full parameters are gathered in ``param_dtype`` (the model computes in it)
and gradients are averaged in ``reduce_dtype``; the shards the optimizer steps keep the
parameters' own dtype (float32 masters).
"""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional

import numpy as np


class ShardingStrategy(Enum):
    FULL_SHARD = "FULL_SHARD"
    SHARD_GRAD_OP = "SHARD_GRAD_OP"
    NO_SHARD = "NO_SHARD"

    @classmethod
    def parse(cls, value: Any) -> "ShardingStrategy":
        """A member, or its name as a string (any case)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and value.upper() in cls.__members__:
            return cls[value.upper()]
        raise ValueError(f"FullyShardedDataParallel: unknown sharding_strategy {value!r}; "
                         f"choose one of {[m.name for m in cls]}")

    @classmethod
    def for_zero_stage(cls, stage: int) -> "ShardingStrategy":
        """DeepSpeed's ``zero_stage``: 3 is FULL_SHARD, 2 SHARD_GRAD_OP, 0 NO_SHARD. Stage 1
        shards the optimizer state only: that is ``ZeroRedundancyOptimizer``, not a wrapper."""
        stages = {0: cls.NO_SHARD, 2: cls.SHARD_GRAD_OP, 3: cls.FULL_SHARD}
        if isinstance(stage, bool) or stage not in stages:
            hint = " (stage 1 is ZeroRedundancyOptimizer)" if stage == 1 else ""
            raise ValueError(f"FullyShardedDataParallel: zero_stage must be one of "
                             f"{sorted(stages)}, got {stage!r}{hint}")
        return stages[stage]

    @property
    def shards_parameters(self) -> bool:
        return self is not ShardingStrategy.NO_SHARD

    @property
    def frees_parameters(self) -> bool:
        """Whether full parameters are released after each forward and backward (ZeRO-3)."""
        return self is ShardingStrategy.FULL_SHARD


@dataclass(frozen=True)
class MixedPrecision:
    """Compute and communication dtypes (torch's ``MixedPrecision``); ``None`` keeps the
    parameters' own dtype. ``cast_forward_inputs``: floating inputs of the wrapper's forward
    are cast to ``param_dtype``, so the whole model computes in it. ``cast_forward_outputs``:
    its floating outputs come back in the parameters' own dtype, so a loss computed from them
    (and its softmax) is float32, as DDP's mixed precision does."""

    param_dtype: Optional[Any] = np.float16
    reduce_dtype: Optional[Any] = np.float16
    cast_forward_inputs: bool = True
    cast_forward_outputs: bool = True

    @classmethod
    def parse(cls, value: Any) -> Optional["MixedPrecision"]:
        """``False``/``None``: off; ``True``: float16 compute and reduction; or an instance."""
        if value is None or value is False:
            return None
        if value is True:
            return cls()
        if isinstance(value, cls):
            return value
        raise TypeError(f"FullyShardedDataParallel: mixed_precision must be a bool or a "
                        f"MixedPrecision, got {value!r}")

    def compute_dtype(self, master: np.dtype) -> np.dtype:
        return np.dtype(master if self.param_dtype is None else self.param_dtype)

    def reduction_dtype(self, master: np.dtype) -> np.dtype:
        return np.dtype(self.compute_dtype(master) if self.reduce_dtype is None
                        else self.reduce_dtype)
