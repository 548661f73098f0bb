"""Affine and shape-only layers: ``Linear``, ``Identity``, ``Flatten``."""
from __future__ import annotations

from typing import Any

from .. import functional as F
from . import init
from ._dtype import as_tensor
from .affine_parameters import add_affine_parameters
from .module import Module


class Linear(Module):
    """``y = x @ weight.T + bias`` with weight of shape (out_features, in_features).

    Initialised as PyTorch does: weight ``kaiming_uniform_(a=sqrt(5))``, i.e.
    U(-1/sqrt(in), 1/sqrt(in)), and bias from the same range.
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if in_features < 0 or out_features < 0:
            raise ValueError(f"Linear sizes must be non-negative, got in_features={in_features}, "
                             f"out_features={out_features}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        add_affine_parameters(self, (self.out_features, self.in_features), bias, device, dtype)

    def reset_parameters(self) -> None:
        init.affine_default_(self.weight, self.bias)

    def forward(self, x: Any) -> Any:
        return F.linear(as_tensor(x), self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class Identity(Module):
    """Returns its input unchanged (accepts and ignores constructor arguments, as PyTorch)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()

    def forward(self, x: Any) -> Any:
        return x


class Flatten(Module):
    """Merge dimensions ``start_dim`` .. ``end_dim`` into one (default: all but the batch)."""

    def __init__(self, start_dim: int = 1, end_dim: int = -1) -> None:
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: Any) -> Any:
        return as_tensor(x).flatten(self.start_dim, self.end_dim)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"
