"""``Dropout2d``: drop whole channels of (N, C, H, W) feature maps in training."""
from __future__ import annotations

from typing import Any

from ..core.ops_channel_dropout import dropout2d
from ._dtype import as_tensor
from .module import Module


class Dropout2d(Module):
    """Zero each channel with probability ``p`` and scale the rest by 1 / (1 - p); the
    identity in eval mode. ``inplace`` is accepted only as False."""

    def __init__(self, p: float = 0.5, inplace: bool = False) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        if inplace:
            raise ValueError("Dropout2d: inplace=True is not supported; use inplace=False")
        self.p, self.inplace = float(p), False

    def forward(self, x: Any) -> Any:
        return dropout2d(as_tensor(x), self.p, self.training)

    def extra_repr(self) -> str:
        return f"p={self.p}, inplace={self.inplace}"
