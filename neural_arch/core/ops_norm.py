"""torch's ``norm`` / ``linalg.vector_norm``: the p-norm over all elements or over ``dim``.

One op rather than a composition, because its gradient has torch's special cases: where the
norm is 0 the gradient is 0 (a composed ``sqrt`` would give NaN), and the inf-norm shares its
gradient evenly among the elements that reach the maximum.
"""
from __future__ import annotations

import math
from typing import Any

from ..backends import xp_of
from .grad_mode import GRAD_MODE
from .ops_reduce import _restore, normalize_axes
from .tensor import Tensor, _constant, _node


def _order(p: Any) -> float:
    if p is None or p == "fro":
        return 2.0
    if isinstance(p, str) or isinstance(p, bool):
        raise ValueError(f"norm: p must be a number or 'fro', got {p!r}")
    return float(p)


def vector_norm(x: Tensor, ord: Any = 2, dim: Any = None, keepdim: bool = False,
                dtype: Any = None) -> Tensor:
    """``torch.linalg.vector_norm``: ``(sum |x|^ord) ** (1 / ord)``, with ord in inf, -inf, 0
    and any other number; over every element when ``dim`` is None."""
    p = _order(ord)
    if dtype is not None:
        x = x.to(dtype)
    a = x.array
    if a.dtype.kind not in "fcV":
        raise RuntimeError(f"linalg.vector_norm: Expected a floating point or complex tensor as "
                           f"input. Got {a.dtype}")
    xp = xp_of(a)
    axes = normalize_axes(dim, a.ndim) if dim is not None and dim != () else None
    keep = bool(keepdim) and axes is not None
    magnitude = xp.abs(a)
    if p == math.inf:
        out = magnitude.max(axis=axes, keepdims=keep)
    elif p == -math.inf:
        out = magnitude.min(axis=axes, keepdims=keep)
    elif p == 0:
        out = (a != 0).sum(axis=axes, keepdims=keep).astype(a.dtype)
    elif p == 1:
        out = magnitude.sum(axis=axes, keepdims=keep)
    elif p == 2:
        out = xp.sqrt((magnitude * magnitude).sum(axis=axes, keepdims=keep))
    else:
        out = ((magnitude ** p).sum(axis=axes, keepdims=keep)) ** (1.0 / p)
    out = xp.asarray(out, dtype=a.dtype)
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)

    def backward(g: Any) -> tuple:
        shape = a.shape
        norm = _restore(out, shape, axes, keep)
        grad = _restore(g, shape, axes, keep)
        if p == 0:
            return (None,)  # torch leaves the gradient undefined: the count has no slope
        if math.isinf(p):
            hits = (magnitude == norm)
            share = hits / _restore(hits.sum(axis=axes, keepdims=keep), shape, axes, keep)
            return ((xp.sign(a) * share * grad).astype(a.dtype),)
        if p == 1:
            return ((xp.sign(a) * grad).astype(a.dtype),)
        safe = xp.where(norm == 0, 1, norm)
        if p == 2:
            scale = a / safe
        else:  # |x|^(p-1) is infinite at 0 for p < 1, where torch's gradient is 0
            with_power = xp.where(magnitude == 0, 1, magnitude) ** (p - 1)
            scale = xp.where(magnitude == 0, 0, xp.sign(a) * with_power) / safe ** (p - 1)
        return (xp.where(norm == 0, 0, scale * grad).astype(a.dtype),)

    return _node(out, (x,), backward)


def norm(input: Tensor, p: Any = "fro", dim: Any = None, keepdim: bool = False,
         dtype: Any = None) -> Tensor:
    """``torch.norm`` / ``Tensor.norm`` for vector norms (``p`` a number or 'fro')."""
    if not isinstance(input, Tensor):
        input = Tensor(input)
    return vector_norm(input, p, dim, keepdim, dtype)
