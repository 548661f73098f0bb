"""Shared by the layers: parameter dtypes, and turning array inputs into tensors."""
from __future__ import annotations

from typing import Any

import numpy as np

from ..core import Tensor
from ..core.dtypes import DEFAULT_FLOAT, is_floating, resolve_dtype


def parameter_dtype(dtype: Any) -> np.dtype:
    """``dtype`` as a NumPy floating dtype; None means the framework's default float."""
    resolved = DEFAULT_FLOAT if dtype is None else resolve_dtype(dtype)
    if not is_floating(resolved):
        raise TypeError(f"parameters need a floating dtype, got {resolved}")
    return resolved


def as_tensor(x: Any) -> Tensor:
    """``x`` itself if it is a Tensor, else a constant Tensor of the array (dtype kept)."""
    return x if isinstance(x, Tensor) else Tensor(x)
