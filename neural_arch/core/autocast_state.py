"""Autocast's per-thread state and the casts an op applies to its inputs at entry.

``neural_arch.amp.autocast`` sets the state; the ops on torch's autocast lists call
``autocast_inputs(op, *tensors)`` first. Outside autocast that call returns its arguments
after one attribute read. Inside it, the op's inputs are cast (with ``astype``, whose backward
casts the gradient back, so float32 parameters receive float32 gradients) as torch does:

* ops on the lower-precision list (matmul, linear, convolutions) run in the autocast dtype:
  their floating inputs other than float64 are cast to it;
* ops on the float32 list run in float32: their float16 and bfloat16 inputs are cast up;
* layer_norm on CPU runs in its input's dtype: a float32 weight and bias meeting a float16
  input are cast to it (torch's CPU kernel takes mixed dtypes and answers in the input's).

The autocast dtype is, as in torch, bfloat16 on CPU and float16 on CUDA unless a region names
another (float16 on CPU too without ``ml_dtypes``, which bfloat16 needs). bfloat16 kernels
compute in float32 (``bfloat16_compute``), which reads the lists through ``active_policy``.

Every other op runs in the widest type of its inputs (NumPy's promotion). The lists differ by
device as torch's do: on CPU, softmax, log_softmax and layer_norm keep their input's dtype; on
CUDA they run in float32. An autocast region for one device leaves the other device's arrays
alone.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

import numpy as np

from .bfloat16 import BFLOAT16

DEVICE_TYPES = ("cpu", "cuda")
LOWER_PRECISION, FLOAT32, FIRST_INPUT = "lower precision", "float32", "first input's dtype"

# einsum, bmm, addmm and baddbmm are on torch's list: an op of that name, once it exists, needs
# only its ``autocast_inputs`` line
_LOWER_PRECISION_OPS = ("matmul", "linear", "conv1d", "conv2d", "einsum", "bmm", "addmm",
                        "baddbmm")
_FLOAT32_LOSSES = ("cross_entropy", "nll_loss", "mse_loss", "l1_loss",
                   "binary_cross_entropy_with_logits")
_CUDA_ONLY_FLOAT32_OPS = ("softmax", "log_softmax", "layer_norm")

# op name -> how it runs under autocast, per device (torch's lists, for the ops we have)
POLICIES: Dict[str, Dict[str, str]] = {
    "cpu": {**dict.fromkeys(_LOWER_PRECISION_OPS, LOWER_PRECISION),
            **dict.fromkeys(_FLOAT32_LOSSES, FLOAT32), "layer_norm": FIRST_INPUT},
    "cuda": {**dict.fromkeys(_LOWER_PRECISION_OPS, LOWER_PRECISION),
             **dict.fromkeys(_FLOAT32_LOSSES + _CUDA_ONLY_FLOAT32_OPS, FLOAT32)},
}

_FLOAT16 = np.dtype(np.float16)
# torch's defaults: bfloat16 on CPU (float16 where ml_dtypes, which bfloat16 needs, is absent)
DEFAULT_DTYPES = {"cpu": _FLOAT16 if BFLOAT16 is None else BFLOAT16, "cuda": _FLOAT16}


class _AutocastState(threading.local):
    """Each thread starts with autocast off, as in torch."""

    def __init__(self) -> None:
        self.enabled = dict.fromkeys(DEVICE_TYPES, False)
        self.dtype = dict(DEFAULT_DTYPES)
        self.any_enabled = False  # the one read an op pays outside autocast


_STATE = _AutocastState()


def check_device_type(device_type: Any) -> str:
    if device_type not in DEVICE_TYPES:
        raise ValueError(f"autocast device_type must be one of {DEVICE_TYPES}, "
                         f"got {device_type!r}")
    return device_type


def is_autocast_enabled(device_type: str = "cuda") -> bool:
    return _STATE.enabled[check_device_type(device_type)]


def get_autocast_dtype(device_type: str) -> np.dtype:
    return _STATE.dtype[check_device_type(device_type)]


def set_autocast_state(device_type: str, enabled: bool, dtype: Any) -> Tuple[bool, np.dtype]:
    """Set one device's state; returns the previous (enabled, dtype) to restore later."""
    check_device_type(device_type)
    previous = (_STATE.enabled[device_type], _STATE.dtype[device_type])
    _STATE.enabled[device_type] = bool(enabled)
    _STATE.dtype[device_type] = np.dtype(dtype)
    _STATE.any_enabled = any(_STATE.enabled.values())
    return previous


def autocast_active() -> bool:
    """Whether autocast is on for any device in this thread."""
    return _STATE.any_enabled


def active_policy(op: str, tensors: Tuple[Any, ...]) -> Tuple[Any, np.dtype]:
    """(how ``op`` runs under autocast for the device of ``tensors``, or None where autocast
    is off there or the op is on no list; that device's autocast dtype)."""
    device = device_of(tensors)
    policy = POLICIES[device].get(op) if _STATE.enabled[device] else None
    return policy, _STATE.dtype[device]


def autocast_inputs(op: str, *tensors: Any) -> Tuple[Any, ...]:
    """``tensors`` cast as autocast wants them for ``op`` (unchanged outside autocast);
    entries that are not tensors (None, arrays, numbers) pass through."""
    if not _STATE.any_enabled:
        return tensors
    return _cast_for(op, tensors)


def device_of(tensors: Tuple[Any, ...]) -> str:
    for tensor in tensors:
        data = getattr(tensor, "array", None)
        if data is not None and hasattr(tensor, "requires_grad"):
            return "cpu" if isinstance(data, (np.ndarray, np.generic)) else "cuda"
    return "cpu"


def _cast_for(op: str, tensors: Tuple[Any, ...]) -> Tuple[Any, ...]:
    from .ops_misc import astype  # ops_misc imports the tensor module, which imports the ops

    policy, low_dtype = active_policy(op, tensors)
    if policy is None:
        return tensors
    first = getattr(tensors[0], "array", None)
    out = []
    for tensor in tensors:
        dtype = getattr(getattr(tensor, "array", None), "dtype", None)
        if dtype is not None and hasattr(tensor, "requires_grad") and _floating(dtype):
            if policy == LOWER_PRECISION and dtype != np.float64:
                tensor = astype(tensor, low_dtype)
            elif policy == FLOAT32 and dtype.itemsize < 4:
                tensor = astype(tensor, np.float32)
            elif policy == FIRST_INPUT and first is not None and _floating(first.dtype):
                tensor = astype(tensor, first.dtype)
        out.append(tensor)
    return tuple(out)


def _floating(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or (BFLOAT16 is not None and dtype == BFLOAT16)
