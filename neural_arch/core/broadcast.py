"""Undo NumPy broadcasting in the backward pass (the only place this is done)."""
from __future__ import annotations

from typing import Any, Tuple


def unbroadcast(grad: Any, shape: Tuple[int, ...]) -> Any:
    """Sum ``grad`` over the axes that broadcasting added or stretched so it has ``shape``."""
    if grad.shape == shape:
        return grad
    extra = grad.ndim - len(shape)
    if extra < 0:
        raise ValueError(f"cannot reduce gradient of shape {grad.shape} to shape {shape}")
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    if grad.shape != shape:
        raise ValueError(f"cannot reduce gradient of shape {grad.shape} to shape {shape}")
    return grad
