"""Activations with hand-written backward passes: softmax, log_softmax, gelu."""
from __future__ import annotations

import math
from typing import Any, Optional

from ..backends import backend_for, xp_of
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715


def _record(x: Tensor, out: Any, backward: Any) -> Tensor:
    if x.requires_grad and GRAD_MODE.enabled:
        return _node(out, (x,), backward)
    return _constant(out)


def softmax(x: Tensor, axis: int = -1, dim: Optional[int] = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (or PyTorch's ``dim``), after subtracting the max."""
    axis = axis if dim is None else dim
    xd = x.data
    xp = xp_of(xd)
    out = xd - xd.max(axis=axis, keepdims=True)
    xp.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)

    def backward(g: Any) -> tuple:
        weighted = g * out
        weighted -= out * weighted.sum(axis=axis, keepdims=True)
        return (weighted,)

    return _record(x, out, backward)


def log_softmax(x: Tensor, axis: int = -1, dim: Optional[int] = None) -> Tensor:
    """x - logsumexp(x) along ``axis`` (or PyTorch's ``dim``)."""
    axis = axis if dim is None else dim
    xd = x.data
    xp = xp_of(xd)
    shifted = xd - xd.max(axis=axis, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(g: Any) -> tuple:
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

    return _record(x, out, backward)


def erf_array(x: Any) -> Any:
    """Elementwise erf of an array with the backend that holds it."""
    return backend_for(x).erf(x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); ``approximate="tanh"`` uses the tanh formula (both as in PyTorch)."""
    xd = x.data
    xp = xp_of(xd)
    if approximate == "none":
        cdf = erf_array(xd * _SQRT_HALF)
        cdf += 1.0
        cdf *= 0.5
        out = xd * cdf

        def backward(g: Any) -> tuple:
            density = xp.exp(-0.5 * xd * xd)
            density *= _INV_SQRT_2PI
            density *= xd
            density += cdf
            return (g * density,)
    elif approximate == "tanh":
        inner = _TANH_SCALE * (xd + _TANH_CUBIC * xd * xd * xd)
        t = xp.tanh(inner)
        out = 0.5 * xd * (1.0 + t)

        def backward(g: Any) -> tuple:
            d_inner = _TANH_SCALE * (1.0 + 3.0 * _TANH_CUBIC * xd * xd)
            return (g * (0.5 * (1.0 + t) + 0.5 * xd * (1.0 - t * t) * d_inner),)
    else:
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return _record(x, out, backward)


def erf(x: Tensor) -> Tensor:
    """Elementwise error function; d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)."""
    xd = x.data
    xp = xp_of(xd)
    scale = 2.0 / math.sqrt(math.pi)
    return _record(x, erf_array(xd), lambda g: (g * (scale * xp.exp(-(xd * xd))),))
