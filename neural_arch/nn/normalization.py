"""``LayerNorm`` over the trailing ``normalized_shape`` dimensions."""
from __future__ import annotations

from typing import Any, Sequence, Union

import numpy as np

from .. import functional as F
from ._dtype import as_tensor, parameter_dtype
from .module import Module
from .parameter import Parameter


class LayerNorm(Module):
    """``(x - mean) / sqrt(var + eps) * weight + bias`` (biased variance, as PyTorch)."""

    def __init__(self, normalized_shape: Union[int, Sequence[int]], eps: float = 1e-5,
                 elementwise_affine: bool = True, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        if isinstance(normalized_shape, (int, np.integer)):
            normalized_shape = (int(normalized_shape),)
        self.normalized_shape = tuple(int(n) for n in normalized_shape)
        self.eps, self.elementwise_affine = float(eps), elementwise_affine
        dtype = parameter_dtype(dtype)
        if elementwise_affine:
            self.weight = Parameter(np.ones(self.normalized_shape, dtype=dtype))
            if bias:
                self.bias = Parameter(np.zeros(self.normalized_shape, dtype=dtype))
            else:
                self.register_parameter("bias", None)
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        if device is not None:
            self.to(device)

    def forward(self, x: Any) -> Any:
        return F.layer_norm(as_tensor(x), self.normalized_shape, self.weight, self.bias, self.eps)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, " \
               f"elementwise_affine={self.elementwise_affine}"
