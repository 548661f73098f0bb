"""``FullyShardedDataParallel`` ("fsdp"): ZeRO-2 or ZeRO-3 through FSDP.

Stage 2 (``SHARD_GRAD_OP``) shards the gradients and the optimizer state, stage 3
(``FULL_SHARD``, the default) the parameters too; gradients are reduce-scattered into the
shards during backward. The stage is the config's when it asks for 2 or 3.
"""
from __future__ import annotations

from typing import Any, Optional

from .wrapped import WrappedStep


class FullyShardedDataParallel(WrappedStep):
    name = "fsdp"

    def __init__(self, stage: Optional[int] = None) -> None:
        super().__init__(overlap=True)  # FSDP reduces during backward by construction
        if stage not in (None, 2, 3):
            raise ValueError(f"FullyShardedDataParallel(stage={stage!r}): the stage must be 2 "
                             f"(gradients and optimizer state sharded) or 3 (parameters too)")
        self._stage = stage
        self.zero_stage = 3 if stage is None else stage

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        if self._stage is None and config.zero_stage in (2, 3):
            self.zero_stage = config.zero_stage
        super().setup(model, optimizer, config, group)
