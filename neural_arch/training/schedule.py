"""The learning-rate schedule a ``TrainingConfig`` names, built from the optimizer package's
schedulers (stepped once per optimizer step): a linear warm-up, then constant, cosine or
linear decay to ``lr * min_lr_ratio`` at ``total_steps``."""
from __future__ import annotations

from typing import Any, Optional

from ..optim import CosineAnnealingLR, LinearLR, SequentialLR


def build_schedule(optimizer: Any, name: str, total_steps: int, warmup_steps: int = 0,
                   min_lr_ratio: float = 0.0) -> Optional[Any]:
    """The scheduler, or None for a constant rate without warm-up."""
    decay_steps = max(1, total_steps - warmup_steps)
    if name == "cosine":
        base = optimizer.param_groups[0]["lr"]
        decay = CosineAnnealingLR(optimizer, T_max=decay_steps, eta_min=base * min_lr_ratio)
    elif name == "linear":
        decay = LinearLR(optimizer, start_factor=1.0, end_factor=min_lr_ratio,
                         total_iters=decay_steps)
    elif name == "constant":
        decay = None
    else:
        raise ValueError(f"unknown lr schedule {name!r}; use constant, cosine or linear")
    if warmup_steps <= 0:
        return decay
    # start_factor must be > 0: the first step runs at lr / (warmup_steps + 1)
    warmup = LinearLR(optimizer, start_factor=1.0 / (warmup_steps + 1), end_factor=1.0,
                      total_iters=warmup_steps)
    if decay is None:
        return warmup
    return SequentialLR(optimizer, [warmup, decay], milestones=[warmup_steps])
