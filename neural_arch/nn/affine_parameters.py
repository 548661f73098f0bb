"""The parameters of an affine layer (``Linear``, the convolutions): a weight whose first
dimension is the outputs, and a bias of one value per output, or none."""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np

from ._dtype import parameter_dtype
from .parameter import Parameter


def add_affine_parameters(module: Any, weight_shape: Tuple[int, ...], bias: bool,
                          device: Any, dtype: Any) -> None:
    """``module.weight`` of ``weight_shape`` and ``module.bias`` (``bias=False``: registered
    as None) in the parameter ``dtype``, initialised by ``module.reset_parameters()``, then
    moved to ``device`` if one is given."""
    dtype = parameter_dtype(dtype)
    module.weight = Parameter(np.empty(weight_shape, dtype=dtype))
    if bias:
        module.bias = Parameter(np.empty(weight_shape[0], dtype=dtype))
    else:
        module.register_parameter("bias", None)
    module.reset_parameters()
    if device is not None:
        module.to(device)


__all__ = ["add_affine_parameters"]
