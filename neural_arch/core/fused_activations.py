"""Activations with hand-written backward passes: relu, softmax, log_softmax, gelu.

Also the switch shared by ``gelu``, ``cross_entropy`` and ``layer_norm``: on float32 CuPy
tensors they run the fused CUDA kernels (through ``neural_arch.core.fused_kernels``) whenever
the arguments are ones those kernels compute exactly; ``NEURAL_ARCH_FUSED_KERNELS=0`` turns
that off.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, Optional

import numpy as np

from .._environ import raw_reader
from ..backends import backend_for, xp_of
from .autocast_state import autocast_inputs
from .bfloat16_compute import computes_bfloat16_in_float32
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import check_saved, modified_error, saved_entry

_TANH_SCALE = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715
_APPROXIMATIONS = ("none", "tanh")

ENV_FUSED_KERNELS = "NEURAL_ARCH_FUSED_KERNELS"
_read_env_fused = raw_reader(ENV_FUSED_KERNELS)
_fused_switch: Dict[Any, bool] = {None: True}  # raw environment value -> enabled
_NDARRAY = np.ndarray
_FLOAT32 = np.dtype(np.float32)
INT32_MAX = 2 ** 31 - 1  # the kernels index rows, classes and features with int32


def fused_kernels_enabled() -> bool:
    """False when ``NEURAL_ARCH_FUSED_KERNELS`` is "0"; read on every call."""
    raw = _read_env_fused()
    enabled = _fused_switch.get(raw)
    if enabled is None:
        enabled = _fused_switch[raw] = os.environ.get(ENV_FUSED_KERNELS, "").strip() != "0"
    return enabled


def on_cuda_float32(array: Any) -> bool:
    """True for a float32 CuPy array while the fused kernels are switched on."""
    if type(array) is _NDARRAY:  # the CPU path: one identity test
        return False
    # backend_for's test for CuPy, without importing CuPy
    return (type(array).__module__.partition(".")[0] == "cupy"
            and array.dtype == _FLOAT32 and fused_kernels_enabled())


def fused_ops() -> Any:
    """``neural_arch.core.fused_kernels``, imported on first use: the core must not load the
    kernel package just to run on the CPU."""
    from . import fused_kernels
    return fused_kernels


def _use_fused_gelu(xd: Any, approximate: str) -> bool:
    """Whether the bias+GELU kernel computes ``gelu(x, approximate)`` for array ``xd``."""
    return (on_cuda_float32(xd) and approximate in _APPROXIMATIONS and xd.ndim >= 1
            and 0 < xd.shape[-1] <= INT32_MAX)


def _record(x: Tensor, out: Any, backward: Any, saved_output: str = "",
            saved_input: str = "") -> Tensor:
    """``saved_output`` / ``saved_input``: the op's name when ``backward`` reads ``out`` /
    ``x``, which is then checked against in-place writes (``versions``)."""
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    if saved_input:
        saved = (saved_entry(x),)

        def input_checked(g: Any) -> tuple:
            check_saved(f"{saved_input}Backward", saved)
            return backward(g)

        return _node(out, (x,), input_checked)
    if not saved_output:
        return _node(out, (x,), backward)
    counter = [0]

    def checked(g: Any) -> tuple:
        if counter[0]:
            raise modified_error(f"{saved_output}Backward", out, counter, 0)
        return backward(g)

    return _node(out, (x,), checked, counter)


_relu_kernels: Any = None  # backends.relu_kernels when Numba runs, else False; on first use


def relu(x: Tensor) -> Tensor:
    """max(x, 0), saving the output for the backward. NumPy float arrays take the compiled
    kernels (``backends.relu_kernels``: one pass each way, torch's rules for NaN and infinite
    values); other arrays (CuPy, integers, ``NEURAL_ARCH_NUMBA=0``) the NumPy form."""
    global _relu_kernels
    xd = x.array
    if type(xd) is _NDARRAY:
        if _relu_kernels is None:
            from ..backends import relu_kernels
            _relu_kernels = relu_kernels if relu_kernels.available() else False
        kernels = _relu_kernels
        if kernels and kernels.takes(xd):
            out = kernels.forward(xd)
            return _record(x, out, lambda g: (kernels.backward(g, out),), "Relu")
    out = xp_of(xd).maximum(xd, 0)
    return _record(x, out, lambda g: (g * (out > 0),), "Relu")


@computes_bfloat16_in_float32("softmax")
def softmax(x: Tensor, axis: int = -1, dim: Optional[int] = None) -> Tensor:
    """exp(x) / sum(exp(x)) along ``axis`` (or PyTorch's ``dim``), after subtracting the max."""
    axis = axis if dim is None else dim
    x, = autocast_inputs("softmax", x)
    xd = x.array
    backend = backend_for(xd)  # one pass per row over the last axis with the CPU kernels
    out = backend.softmax(xd, axis, None)
    return _record(x, out, lambda g: (backend.softmax_backward(g, out, axis),), "Softmax")


@computes_bfloat16_in_float32("softmax")
def causal_softmax(x: Tensor, offset: int = 0) -> Tensor:
    """Softmax over the last axis where, in each matrix of the last two axes, entry (i, j) with
    j > i + offset counts as -inf: ``softmax(x.masked_fill(future, -inf), -1)`` without
    building the mask (the CPU kernels skip the masked tail of each row). A row left with no
    entry is NaN, as there."""
    x, = autocast_inputs("softmax", x)
    xd = x.array
    if xd.ndim < 2:
        raise ValueError(f"causal_softmax needs at least 2 dimensions, got shape {xd.shape}")
    backend = backend_for(xd)
    out = backend.softmax(xd, -1, int(offset))
    return _record(x, out, lambda g: (backend.softmax_backward(g, out, -1),), "Softmax")


@computes_bfloat16_in_float32("log_softmax")
def log_softmax(x: Tensor, axis: int = -1, dim: Optional[int] = None) -> Tensor:
    """x - logsumexp(x) along ``axis`` (or PyTorch's ``dim``)."""
    axis = axis if dim is None else dim
    x, = autocast_inputs("log_softmax", x)
    xd = x.array
    xp = xp_of(xd)
    shifted = xd - xd.max(axis=axis, keepdims=True)
    out = shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))

    def backward(g: Any) -> tuple:
        return (g - xp.exp(out) * g.sum(axis=axis, keepdims=True),)

    return _record(x, out, backward, "LogSoftmax")


def erf_array(x: Any) -> Any:
    """Elementwise erf of an array with the backend that holds it."""
    return backend_for(x).erf(x)


@computes_bfloat16_in_float32()
def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """x * Phi(x); ``approximate="tanh"`` uses the tanh formula (both as in PyTorch)."""
    xd = x.array
    if type(xd) is not _NDARRAY and _use_fused_gelu(xd, approximate):
        return fused_ops().fused_bias_gelu(x, None, approximate)
    if approximate == "none":
        # the backend computes the derivative with the forward (one pass over memory with the
        # compiled CPU kernel) only when a backward will need it
        need_grad = x.requires_grad and GRAD_MODE.enabled
        out, derivative = backend_for(xd).gelu(xd, need_grad)
        if not need_grad:
            return _constant(out)
        saved = (saved_entry(x),)  # torch saves the input; the derivative here is precomputed

        def backward(g: Any) -> tuple:
            check_saved("GeluBackward", saved)
            return (g * derivative,)

        return _node(out, (x,), backward)
    xp = xp_of(xd)
    if approximate == "tanh":
        inner = _TANH_SCALE * (xd + _TANH_CUBIC * xd * xd * xd)
        t = xp.tanh(inner)
        out = 0.5 * xd * (1.0 + t)

        def backward(g: Any) -> tuple:
            d_inner = _TANH_SCALE * (1.0 + 3.0 * _TANH_CUBIC * xd * xd)
            return (g * (0.5 * (1.0 + t) + 0.5 * xd * (1.0 - t * t) * d_inner),)
    else:
        raise ValueError(f"gelu approximate must be 'none' or 'tanh', got {approximate!r}")
    return _record(x, out, backward, saved_input="Gelu")


@computes_bfloat16_in_float32()
def erf(x: Tensor) -> Tensor:
    """Elementwise error function; d/dx erf(x) = 2 / sqrt(pi) * exp(-x^2)."""
    xd = x.array
    xp = xp_of(xd)
    scale = 2.0 / math.sqrt(math.pi)
    return _record(x, erf_array(xd), lambda g: (g * (scale * xp.exp(-(xd * xd))),),
                   saved_input="Erf")
