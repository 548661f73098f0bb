"""Operations that change where or how the data is stored: ``astype``, ``to``, ``clone``."""
from __future__ import annotations

from typing import Any

from ..backends import backend_for, device_type, get_backend
from .dtypes import is_floating, resolve_dtype
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node


def astype(x: Tensor, dtype: Any) -> Tensor:
    """Cast to ``dtype``; the gradient is cast back. Casting to an integer cuts the graph."""
    wanted = resolve_dtype(dtype)
    xd = x.array
    if xd.dtype == wanted:
        return x
    out = xd.astype(wanted)
    if not (x.requires_grad and GRAD_MODE.enabled and is_floating(wanted)):
        return _constant(out)
    source = xd.dtype
    return _node(out, (x,), lambda g: (g.astype(source),))


def to(x: Tensor, device: Any = None, dtype: Any = None) -> Tensor:
    """Move to ``device`` ("cpu", "cuda", "cuda:N", or an int N meaning "cuda:N" as in torch)
    and/or cast to ``dtype``; differentiable. ``t.to(float64)`` (a dtype alone) casts."""
    if isinstance(device, (str, int)) or device is None:  # bool is an int: an error below
        target_kind = None if device is None else device_type(device)
    else:  # `t.to(float64)` as a dtype-only call
        target_kind, dtype = None, device
    out = x
    if target_kind is not None and target_kind != x.device:
        source = backend_for(x.array)
        target = get_backend("numpy" if target_kind == "cpu" else "cupy")
        moved = target.asarray(x.array)
        if x.requires_grad and GRAD_MODE.enabled:
            out = _node(moved, (x,), lambda g: (source.asarray(g),))
        else:
            out = _constant(moved)
    if dtype is not None:
        out = astype(out, dtype)
    return out


def clone(x: Tensor) -> Tensor:
    """A copy of the data that stays in the graph (gradient passes through unchanged)."""
    out = x.array.copy()
    if x.requires_grad and GRAD_MODE.enabled:
        return _node(out, (x,), lambda g: (g,))
    return _constant(out)
