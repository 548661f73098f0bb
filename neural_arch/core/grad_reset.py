"""Resetting gradients, as ``Module.zero_grad`` and ``Optimizer.zero_grad`` both do."""
from __future__ import annotations

from typing import Iterable


def zero_grads(params: Iterable, set_to_none: bool = True) -> None:
    """Drop every parameter's gradient, or with ``set_to_none=False`` fill it with zeros in
    place, counted as an in-place write (torch's ``grad.zero_()`` counts it too)."""
    for param in params:
        if param.grad is None:
            continue
        if set_to_none:
            param.grad = None
        else:
            param.grad.array[...] = 0
            param.grad.mark_modified_in_place()


__all__ = ["zero_grads"]
