"""``WrappedStep``: the strategies whose step is ``AdvancedDistributedDataParallel``'s.

One process, DDP, ZeRO-1, FSDP (ZeRO-2/3) and data parallelism over the dp group of a
tensor-parallel model all run the same step: forward, ``backward_step`` (accumulation, the
gradient average, the overflow check, clipping by the global norm, the optimizer step) and
the checkpoint manager for the module, the optimizer and the loss scaler. What a subclass
fixes is the ZeRO stage, whether communication overlaps backward, and what it checks.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional, Tuple

import numpy as np

from ...distributed.ddp.advanced import AdvancedDistributedDataParallel
from ..batches import batch_size_of, forward
from .base import StepOutcome, Strategy
from .checkpoints import ManagerCheckpoints


class WrappedStep(Strategy):
    # the ZeRO stage this strategy runs; a config asking for another one is refused
    zero_stage = 0
    # ZeRO-1 by reduce-scatter instead of DDP's all-reduce (AdvancedDistributedDataParallel's)
    reduce_scatter = False

    def __init__(self, overlap: bool = True) -> None:
        super().__init__()
        self.overlap = bool(overlap)  # bucketed all-reduce during backward (DDP's hooks)
        self.wrapper: Any = None

    def _check(self, model: Any, config: Any, group: Any) -> None:
        """Refuse what this strategy cannot run (a subclass adds its own checks)."""
        if config.zero_stage not in (0, self.zero_stage):
            raise ValueError(f"strategy {self.name!r} runs ZeRO stage {self.zero_stage}, but "
                             f"TrainingConfig.zero_stage is {config.zero_stage}; leave it at 0 "
                             f"or choose the strategy for stage {config.zero_stage}")

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        self._check(model, config, group)
        settings = dataclasses.replace(config.data_parallel(), zero_stage=self.zero_stage)
        self.group, self.model = group, model
        # the reduce-scatter path keeps the parameters as views of one host buffer: a model
        # on a GPU runs ZeRO-1 as DDP plus ZeroRedundancyOptimizer (the same updates)
        on_host = all(type(p.array) is np.ndarray for p in model.parameters())
        self.wrapper = AdvancedDistributedDataParallel(model, settings, group=group,
                                                       overlap=self.overlap,
                                                       reduce_scatter=self.reduce_scatter
                                                       and on_host)
        self._mixed = settings.mixed_precision
        if self.zero_stage == 1:
            optimizer = self.wrapper.wrap_optimizer(optimizer)
        elif self.zero_stage in (2, 3):  # the optimizer must hold the shards: rebuild it
            optimizer = self.wrapper.wrap_optimizer(type(optimizer), **optimizer.defaults)
        self.optimizer = optimizer
        self.scale_learning_rate(config)

    def train(self) -> None:
        self.wrapper.train()

    def eval(self) -> None:
        self.wrapper.eval()

    def training_step(self, batch: Any, loss_fn: Optional[Callable]) -> StepOutcome:
        _, loss, _ = forward(self.wrapper, batch, loss_fn)
        stepped = self.wrapper.backward_step(loss, self.optimizer)
        return StepOutcome(float(loss.item()), batch_size_of(batch), stepped)

    def evaluation_step(self, batch: Any,
                        loss_fn: Optional[Callable]) -> Tuple[Any, float, Any]:
        output, loss, target = forward(self.wrapper, batch, loss_fn)
        return output, float(loss.item()), target

    @property
    def grad_norm(self) -> Optional[float]:
        return float(self.wrapper.get_statistics()["gradient_norms"]["last"])

    def comm_ms(self) -> Optional[float]:
        return float(self.wrapper.get_statistics()["communication_time_ms"]["total"])

    def comm_hidden_ms(self) -> Optional[float]:
        return float(self.wrapper.get_statistics()["communication_time_ms"]["hidden"])

    def checkpoints(self, config: Any, resume_group: Any = None) -> ManagerCheckpoints:
        scaler = self.wrapper.scaler if self._mixed else None
        return ManagerCheckpoints(config.checkpoint_dir, config.max_checkpoints,
                                  self.wrapper.module, self.optimizer, scaler,
                                  group=self.group, resume_group=resume_group)
