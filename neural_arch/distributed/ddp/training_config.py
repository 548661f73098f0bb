"""``DistributedTrainingConfig``: the settings of ``AdvancedDistributedDataParallel`` (the
checkpoint manager reads its checkpoint fields), each checked when the config is made."""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

_ZERO_STAGES = (0, 1, 2, 3)


def _check(name: str, value: Any, integer: bool, low: float, strict: bool = True) -> None:
    """TypeError unless ``value`` is a number (an int when ``integer``; bools are neither);
    ValueError unless it is finite and above ``low`` (at least ``low`` when not ``strict``)."""
    kinds = (int, np.integer) if integer else (int, float, np.integer, np.floating)
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, kinds):
        what = "an int" if integer else "a number"
        raise TypeError(f"DistributedTrainingConfig.{name} must be {what}, got {value!r}")
    if not (math.isfinite(value) and (value > low if strict else value >= low)):
        relation = ">" if strict else ">="
        raise ValueError(f"DistributedTrainingConfig.{name} must be {relation} {low}, "
                         f"got {value!r}")


@dataclass
class DistributedTrainingConfig:
    """Settings of ``AdvancedDistributedDataParallel`` (checkpoint fields are read by the
    checkpoint manager); values are checked on construction."""

    gradient_accumulation_steps: int = 1
    max_grad_norm: Optional[float] = None
    mixed_precision: bool = False
    loss_scale: float = 65536.0
    dynamic_loss_scaling: bool = True
    loss_scale_window: int = 1000
    min_loss_scale: float = 1.0
    bucket_size_mb: float = 25
    checkpoint_frequency: int = 100
    checkpoint_dir: str = "./checkpoints"
    profile_communication: bool = False
    log_gradient_norms: bool = False
    # 0: plain DDP; 1: optimizer state sharded (see wrap_optimizer); 2: gradients too;
    # 3: parameters too (2 and 3: FullyShardedDataParallel inside)
    zero_stage: int = 0

    def __post_init__(self) -> None:
        _check("gradient_accumulation_steps", self.gradient_accumulation_steps, True, 1, False)
        if self.max_grad_norm is not None:
            _check("max_grad_norm", self.max_grad_norm, False, 0.0)
        _check("loss_scale", self.loss_scale, False, 0.0)
        _check("loss_scale_window", self.loss_scale_window, True, 1, False)
        _check("min_loss_scale", self.min_loss_scale, False, 0.0)
        if self.min_loss_scale > self.loss_scale:
            raise ValueError(f"DistributedTrainingConfig.min_loss_scale ({self.min_loss_scale}) "
                             f"must not exceed loss_scale ({self.loss_scale})")
        _check("bucket_size_mb", self.bucket_size_mb, False, 0.0)
        _check("checkpoint_frequency", self.checkpoint_frequency, True, 1, False)
        if not isinstance(self.checkpoint_dir, (str, os.PathLike)) or not str(self.checkpoint_dir):
            raise ValueError(f"DistributedTrainingConfig.checkpoint_dir must be a non-empty path, "
                             f"got {self.checkpoint_dir!r}")
        stage = self.zero_stage
        if (isinstance(stage, (bool, np.bool_)) or not isinstance(stage, (int, np.integer))
                or stage not in _ZERO_STAGES):
            raise ValueError(f"DistributedTrainingConfig.zero_stage must be one of "
                             f"{list(_ZERO_STAGES)}, got {stage!r}")
        for name in ("mixed_precision", "dynamic_loss_scaling", "profile_communication",
                     "log_gradient_norms"):
            if not isinstance(getattr(self, name), (bool, np.bool_)):
                raise TypeError(f"DistributedTrainingConfig.{name} must be a bool, got "
                                f"{getattr(self, name)!r}")
