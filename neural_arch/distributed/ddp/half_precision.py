"""Float16 compute around float32 master weights: the forward of ``AdvancedDistributedDataParallel``
with ``mixed_precision=True``.

For the duration of a call each floating parameter's ``.array`` is a float16 copy of its
float32 master, and floating inputs are cast to float16, so the whole model computes in
float16; the masters are put back afterwards, whatever happens, and floating outputs come back
as float32 (the loss and its softmax are computed in float32). Backward then runs through the
float16 graph and each gradient lands on its parameter as float32, the leaf's dtype.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from ...core import Tensor
from ...nn import Module


def overflow_expected() -> np.errstate:
    """Float16 overflow is expected under loss scaling (the step is skipped and the scale
    shrinks), not something for NumPy to warn about."""
    return np.errstate(over="ignore", invalid="ignore")


def cast_floats(value: Any, dtype: Any) -> Any:
    """``value`` with every floating Tensor/array (also inside tuples, lists, dicts) cast."""
    if isinstance(value, Tensor):
        return value.astype(dtype) if value.dtype.kind == "f" else value
    if hasattr(value, "dtype") and hasattr(value, "astype"):
        return value.astype(dtype) if value.dtype.kind == "f" else value
    if isinstance(value, (tuple, list)):
        return type(value)(cast_floats(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: cast_floats(v, dtype) for k, v in value.items()}
    return value


def forward_in_float16(module: Module, call: Callable[..., Any], *args: Any,
                       **kwargs: Any) -> Any:
    """``call(*args, **kwargs)`` (the wrapper running ``module``) in float16 (see the module
    docstring); floating outputs as float32."""
    masters = [(p, p.array) for p in module.parameters() if p.array.dtype.kind == "f"]
    try:
        for p, master in masters:
            p.array = master.astype(np.float16)
        with overflow_expected():
            out = call(*cast_floats(args, np.float16), **cast_floats(kwargs, np.float16))
    finally:
        for p, master in masters:
            p.array = master
    return cast_floats(out, np.float32)
