"""Loss modules wrapping the functional losses."""
from __future__ import annotations

from typing import Any

from .. import functional as F
from .module import Module

_REDUCTIONS = ("mean", "sum", "none")


def _check_reduction(reduction: str) -> str:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    return reduction


class CrossEntropyLoss(Module):
    """Softmax cross-entropy of logits (N, C) or (N, C, ...) against integer class targets."""

    def __init__(self, reduction: str = "mean", ignore_index: int = -100,
                 label_smoothing: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= label_smoothing <= 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1], got {label_smoothing}")
        self.reduction = _check_reduction(reduction)
        self.ignore_index, self.label_smoothing = int(ignore_index), float(label_smoothing)

    def forward(self, logits: Any, target: Any) -> Any:
        return F.cross_entropy(logits, target, reduction=self.reduction,
                               ignore_index=self.ignore_index,
                               label_smoothing=self.label_smoothing)

    def extra_repr(self) -> str:
        return f"reduction='{self.reduction}', ignore_index={self.ignore_index}, " \
               f"label_smoothing={self.label_smoothing}"


class MSELoss(Module):
    """Mean (or summed) squared error."""

    def __init__(self, reduction: str = "mean") -> None:
        super().__init__()
        self.reduction = _check_reduction(reduction)

    def forward(self, input: Any, target: Any) -> Any:
        return F.mse_loss(input, target, reduction=self.reduction)

    def extra_repr(self) -> str:
        return f"reduction='{self.reduction}'"
