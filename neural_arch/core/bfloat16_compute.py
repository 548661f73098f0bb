"""``computes_bfloat16_in_float32``: bfloat16 for the ops whose kernels know float16/32/64 only.

torch's CPU kernels compute bfloat16 in float32 ("opmath") and round each result once; the
matmul, linear, layer norm, softmax, GELU, loss and einsum kernels here do the same through this
decorator: bfloat16 tensor arguments are cast to float32 (differentiably, so gradients come back
rounded to bfloat16 as torch's do), the kernel runs, and its float32 tensor results are rounded
to bfloat16.

Under autocast the decorator applies the op's autocast rule first (``autocast_state``), then
runs the kernel with autocast off for that device, since its inputs are already settled:

* an op on the lower-precision list whose autocast dtype is bfloat16 rounds its floating
  inputs (but float64) to bfloat16, then computes as above;
* an op on the float32 list, or on the lower-precision list under a float16 region, runs as
  it always does: autocast inside it casts its bfloat16 inputs to float32 or float16;
* layer_norm on CPU (first input's dtype) computes a bfloat16 input with its float32 weight and
  bias as they are, and answers in bfloat16, as torch's mixed-dtype CPU kernel does.

Arguments and results without bfloat16 take the plain path: one scan of the arguments.
Without ``ml_dtypes`` the decorator returns the function unchanged.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Dict, Optional, Tuple

from . import autocast_state
from .bfloat16 import BFLOAT16
from .tensor import Tensor

_FLOAT32 = "float32"


def computes_bfloat16_in_float32(op: Optional[str] = None) -> Callable[[Callable], Callable]:
    """Decorate the kernel of ``op`` (its name on the autocast lists, None when on none)."""

    def decorate(kernel: Callable) -> Callable:
        if BFLOAT16 is None:
            return kernel

        @functools.wraps(kernel)
        def run(*args: Any, **kwargs: Any) -> Any:
            if autocast_state.autocast_active() or _holds_bfloat16(args, kwargs):
                return _run_settled(kernel, op, args, kwargs)
            return kernel(*args, **kwargs)

        return run

    return decorate


def _run_settled(kernel: Callable, op: Optional[str], args: Tuple[Any, ...],
                 kwargs: Dict[str, Any]) -> Any:
    """The kernel on bfloat16 data or under autocast: in float32 where bfloat16 is involved."""
    policy, low_dtype = _policy(op, args, kwargs)
    lowered = policy == autocast_state.LOWER_PRECISION and low_dtype == BFLOAT16
    if not lowered and (policy in (autocast_state.LOWER_PRECISION, autocast_state.FLOAT32)
                        or not _holds_bfloat16(args, kwargs)):
        return kernel(*args, **kwargs)  # autocast inside the kernel casts bfloat16 away
    cast = functools.partial(_to_float32, lowered=lowered)
    args = tuple(cast(value) for value in args)
    kwargs = {name: cast(value) for name, value in kwargs.items()}
    with _autocast_off(args, kwargs):
        result = kernel(*args, **kwargs)
    return _rounded(result)


def _tensors(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Tensor, ...]:
    return tuple(value for value in (*args, *kwargs.values()) if isinstance(value, Tensor))


def _holds_bfloat16(args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> bool:
    # Runs on every call of every decorated op, so the test is by identity first: NumPy hands
    # out one bfloat16 dtype object, and `==` against a float dtype costs several times more
    # (NumPy asks the promotion machinery). bfloat16 is of kind "V"; `==` settles only those.
    for value in (*args, *kwargs.values()) if kwargs else args:
        if isinstance(value, Tensor):
            dtype = value.array.dtype
            if dtype is BFLOAT16 or (dtype.kind == "V" and dtype == BFLOAT16):
                return True
    return False


def _policy(op: Optional[str], args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    """(how autocast runs ``op`` on these arguments' device, or None; its dtype there)."""
    if op is None or not autocast_state.autocast_active():
        return None, None
    return autocast_state.active_policy(op, _tensors(args, kwargs))


def _to_float32(value: Any, lowered: bool) -> Any:
    """A bfloat16 tensor as float32; with ``lowered`` (autocast's bfloat16 list) every
    floating tensor but float64 is first rounded to bfloat16."""
    from .ops_misc import astype  # ops_misc imports tensor.py, which imports the ops

    if not isinstance(value, Tensor):
        return value
    dtype = value.array.dtype
    if lowered and dtype.kind == "f" and dtype.itemsize < 8:
        value = astype(value, BFLOAT16)
    elif dtype != BFLOAT16:
        return value
    return astype(value, _FLOAT32)


def _rounded(result: Any) -> Any:
    """A float32 tensor result rounded to bfloat16 (the decorated kernels return one tensor)."""
    from .ops_misc import astype

    if isinstance(result, Tensor) and result.array.dtype == _FLOAT32:
        return astype(result, BFLOAT16)
    return result


class _autocast_off:
    """Autocast disabled for the device of these arguments while the kernel runs."""

    def __init__(self, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        self._tensors = _tensors(args, kwargs)
        self._device: Optional[str] = None
        self._saved: Any = None

    def __enter__(self) -> None:
        if autocast_state.autocast_active():
            self._device = autocast_state.device_of(self._tensors)
            if autocast_state.is_autocast_enabled(self._device):
                self._saved = autocast_state.set_autocast_state(
                    self._device, False, autocast_state.get_autocast_dtype(self._device))

    def __exit__(self, *exc_info: Any) -> None:
        if self._saved is not None:
            autocast_state.set_autocast_state(self._device, *self._saved)
