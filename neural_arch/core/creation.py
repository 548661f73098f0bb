"""torch's creation functions that ``factories`` lacks: ``linspace``, ``full_like``,
``empty_like``."""
from __future__ import annotations

from typing import Any

import numpy as np

from .dtypes import DEFAULT_FLOAT, resolve_dtype
from .tensor import Tensor
from .torch_memory_format import full_in_format, preserve_format


def linspace(start: Any, end: Any, steps: int, *, dtype: Any = None, device: Any = None,
             requires_grad: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` inclusive (float32 default);
    computed in float64, then cast."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 0:
        raise RuntimeError(f"linspace: number of steps must be a non-negative int, got "
                           f"{steps!r}")
    start = start.item() if isinstance(start, Tensor) else start
    end = end.item() if isinstance(end, Tensor) else end
    wanted = resolve_dtype(dtype if dtype is not None else DEFAULT_FLOAT)
    values = np.linspace(start, end, int(steps), dtype=np.float64)
    if wanted.kind in "iu":  # torch truncates toward zero for integer dtypes
        values = np.trunc(values)
    return Tensor(values.astype(wanted), requires_grad=requires_grad, device=device)


def _like(input: Any, dtype: Any) -> tuple:
    data = input.array if isinstance(input, Tensor) else np.asarray(input)
    wanted = resolve_dtype(dtype) if dtype is not None else data.dtype
    return data, wanted, getattr(input, "device", None)


def full_like(input: Any, fill_value: Any, *, dtype: Any = None, device: Any = None,
              requires_grad: bool = False, memory_format: Any = preserve_format) -> Tensor:
    """A tensor of ``input``'s shape (and dtype, unless given; layout, unless
    ``memory_format`` says another) filled with ``fill_value``."""
    data, wanted, source_device = _like(input, dtype)
    return Tensor(full_in_format(data, fill_value, wanted, memory_format, "full_like"),
                  requires_grad=requires_grad, device=device or source_device)


def empty_like(input: Any, *, dtype: Any = None, device: Any = None,
               requires_grad: bool = False, memory_format: Any = preserve_format) -> Tensor:
    """A tensor of ``input``'s shape and dtype (and layout, unless ``memory_format`` says
    another); its values are unspecified (zeros here)."""
    data, wanted, source_device = _like(input, dtype)
    return Tensor(full_in_format(data, 0, wanted, memory_format, "empty_like"),
                  requires_grad=requires_grad, device=device or source_device)
