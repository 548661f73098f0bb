"""Gradient clipping with PyTorch's semantics."""
from __future__ import annotations

import math
from typing import Any, Iterable, Union

import numpy as np

from ..backends import xp_of


def _grads(parameters: Union[Any, Iterable[Any]]) -> list:
    if hasattr(parameters, "grad") and hasattr(parameters, "array"):
        parameters = [parameters]
    return [p.grad.array for p in parameters if p.grad is not None]


def _norm(grad: Any, norm_type: float) -> float:
    flat = grad.ravel()
    if flat.size == 0:
        return 0.0
    if norm_type == math.inf:
        return float(abs(flat).max())
    if norm_type == -math.inf:
        return float(abs(flat).min())
    if norm_type == 2.0:
        flat = flat.astype(np.float64, copy=False)
        return math.sqrt(float(flat @ flat))
    if norm_type == 0:
        return float((flat != 0).sum())
    return float((abs(flat.astype(np.float64, copy=False)) ** norm_type).sum()) ** (1.0 / norm_type)


def _combine(norms: list, norm_type: float) -> float:
    if norm_type == math.inf:
        return max(norms)
    if norm_type == -math.inf:
        return min(norms)
    if norm_type == 0:
        return float(sum(norms))
    return float(sum(n ** norm_type for n in norms)) ** (1.0 / norm_type)


def clip_grad_norm_(parameters: Union[Any, Iterable[Any]], max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> np.float64:
    """Scale all gradients together so their joint ``norm_type`` norm is at most ``max_norm``.

    The scale is ``max_norm / (total_norm + 1e-6)`` and is applied only when below 1. Returns the
    total norm before clipping (a NumPy float64 scalar, so ``float()`` and ``.item()`` both work).
    """
    norm_type = float(norm_type)
    grads = _grads(parameters)
    if not grads:
        return np.float64(0.0)
    total = _combine([_norm(g, norm_type) for g in grads], norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise RuntimeError(
            f"the total norm of order {norm_type} of the gradients is {total}; set "
            f"error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # also scales by NaN when the norm is NaN, as PyTorch does
        for grad in grads:
            grad *= coef
    return np.float64(total)


def clip_grad_value_(parameters: Union[Any, Iterable[Any]], clip_value: float) -> None:
    """Clamp every gradient element into ``[-clip_value, clip_value]`` in place."""
    clip_value = float(clip_value)
    for grad in _grads(parameters):
        xp_of(grad).clip(grad, -clip_value, clip_value, out=grad)
