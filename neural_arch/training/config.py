"""``TrainingConfig``: every setting of ``Trainer`` in one checked dataclass.

The data-parallel fields (accumulation, clipping, mixed precision, loss scaling, ZeRO stage)
are handed on to ``DistributedTrainingConfig``, which ``AdvancedDistributedDataParallel``
executes: the Trainer adds the loop around it, not a second implementation of the step.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from ..distributed.ddp.training_config import DistributedTrainingConfig

_SCHEDULES = ("constant", "cosine", "linear")


@dataclass
class TrainingConfig:
    epochs: int = 1
    max_steps: Optional[int] = None         # optimizer steps; stops inside an epoch
    gradient_accumulation_steps: int = 1
    max_grad_norm: Optional[float] = None   # clip by the global 2-norm (None: no clipping)
    mixed_precision: bool = False           # float16 compute, float32 master weights
    loss_scale: float = 65536.0
    loss_scale_window: int = 1000           # clean steps before the loss scale grows
    zero_stage: int = 0                     # 0 DDP, 1 sharded optimizer, 2/3 FSDP
    lr_schedule: str = "constant"           # "constant", "cosine" or "linear" decay
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0               # cosine/linear end at lr * min_lr_ratio
    seed: int = 0                           # the shuffle of the training data
    log_interval: int = 10                  # steps between train-loss records
    eval_interval: Optional[int] = None     # steps between validations (None: per epoch)
    eval_batches: Optional[int] = None      # cap on validation batches (None: all)
    checkpoint_dir: Optional[str] = None    # None: no checkpoints
    save_interval: Optional[int] = None     # steps between checkpoints (None: epoch ends)
    save_every_epochs: int = 1              # without save_interval: every Nth epoch's end
    max_checkpoints: int = 3
    resume: bool = False                    # continue from the newest checkpoint, if any
    metrics_dir: Optional[str] = None       # metrics.jsonl (+ TensorBoard) go here
    tokens_per_sample: Optional[int] = None # for tokens/s (a sequence model's block size)
    compute_accuracy: bool = True           # argmax accuracy in validation, when shapes fit
    early_stopping_patience: Optional[int] = None  # epochs without improvement
    monitor: str = "val_loss"               # what early stopping and ``best`` watch
    progress_bar: bool = True               # tqdm on rank 0 when on a terminal
    verbose: bool = True                    # rank 0 prints interval and epoch lines
    scale_lr: bool = False                  # lr x data-parallel ranks at set-up (linear rule)

    def __post_init__(self) -> None:
        def positive(name: str, allow_none: bool = False) -> None:
            value = getattr(self, name)
            if value is None and allow_none:
                return
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"TrainingConfig.{name} must be a positive integer, got "
                                 f"{value!r}")
        for name in ("epochs", "gradient_accumulation_steps", "log_interval", "max_checkpoints",
                     "save_every_epochs"):
            positive(name)
        for name in ("max_steps", "eval_interval", "eval_batches", "save_interval",
                     "tokens_per_sample", "early_stopping_patience"):
            positive(name, allow_none=True)
        if self.save_interval is not None and self.save_every_epochs != 1:
            raise ValueError(f"TrainingConfig.save_every_epochs={self.save_every_epochs} has no "
                             f"effect beside save_interval={self.save_interval} (checkpoints "
                             f"every {self.save_interval} steps); set one of them")
        if self.lr_schedule not in _SCHEDULES:
            raise ValueError(f"TrainingConfig.lr_schedule must be one of {list(_SCHEDULES)}, "
                             f"got {self.lr_schedule!r}")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) \
                or self.warmup_steps < 0:
            raise ValueError(f"TrainingConfig.warmup_steps must be >= 0, got "
                             f"{self.warmup_steps!r}")
        if not (0.0 <= self.min_lr_ratio <= 1.0):
            raise ValueError(f"TrainingConfig.min_lr_ratio must be in [0, 1], got "
                             f"{self.min_lr_ratio!r}")
        if not isinstance(self.scale_lr, bool):
            raise ValueError(f"TrainingConfig.scale_lr must be True or False, got "
                             f"{self.scale_lr!r}")
        if self.monitor not in ("val_loss", "train_loss"):
            raise ValueError(f"TrainingConfig.monitor must be 'val_loss' or 'train_loss', got "
                             f"{self.monitor!r}")
        if self.max_grad_norm is not None and not (
                math.isfinite(self.max_grad_norm) and self.max_grad_norm > 0):
            raise ValueError(f"TrainingConfig.max_grad_norm must be > 0 or None, got "
                             f"{self.max_grad_norm!r}")
        self.data_parallel()  # its own checks (zero_stage, loss_scale) now, not at fit()

    def data_parallel(self) -> DistributedTrainingConfig:
        """The settings ``AdvancedDistributedDataParallel`` runs the step with."""
        return DistributedTrainingConfig(
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            max_grad_norm=self.max_grad_norm, mixed_precision=bool(self.mixed_precision),
            loss_scale=float(self.loss_scale), loss_scale_window=self.loss_scale_window,
            zero_stage=self.zero_stage)
