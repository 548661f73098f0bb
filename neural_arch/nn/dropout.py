"""``Dropout``: zero elements with probability p in training, scale survivors by 1/(1-p)."""
from __future__ import annotations

from typing import Any

from .. import functional as F
from ._dtype import as_tensor
from .module import Module


class Dropout(Module):
    """Inverted dropout; the identity in eval mode or when ``p == 0``."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"dropout probability must be in [0, 1], got {p}")
        self.p = float(p)

    def forward(self, x: Any) -> Any:
        if not self.training or self.p == 0.0:
            return x
        return F.dropout(as_tensor(x), self.p, True)

    def extra_repr(self) -> str:
        return f"p={self.p}"
