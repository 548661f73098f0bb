"""CuPy backend: arrays on an NVIDIA GPU. CuPy is imported only when this module is used."""
from __future__ import annotations

from typing import Any, Optional, Tuple

from . import row_ops, special

name = "cupy"
device = "cuda"

try:
    import cupy as _cupy
except ImportError as exc:  # the optional dependency is absent
    _cupy = None
    _IMPORT_ERROR: Any = exc
else:
    _IMPORT_ERROR = None
_device_seen = False  # a device, once found, stays for the process's life


def _unavailable_reason() -> str:
    if _cupy is None:
        return f"CuPy is not installed ({_IMPORT_ERROR}); install cupy-cuda12x to use device='cuda'"
    try:
        count = _cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        return f"CuPy could not reach a CUDA device: {exc}"
    return "" if count > 0 else "CuPy found no CUDA device"


def is_available() -> bool:
    """True when CuPy imports and at least one CUDA device answers."""
    return _device_seen or _unavailable_reason() == ""


def require() -> Any:
    """Return the ``cupy`` module, or raise RuntimeError saying why the GPU cannot be used."""
    global _device_seen
    if _device_seen:  # every array op comes here: a driver query each time cost microseconds
        return _cupy
    reason = _unavailable_reason()
    if reason:
        raise RuntimeError(f"device 'cuda' is not available: {reason}")
    _device_seen = True
    return _cupy


def __getattr__(attribute: str) -> Any:
    # `xp` and `array_type` resolve on first use so that importing this module never fails.
    if attribute == "xp":
        return require()
    if attribute in ("array_type", "array_types"):
        cupy = require()
        return cupy.ndarray if attribute == "array_type" else (cupy.ndarray,)
    raise AttributeError(f"module {__name__!r} has no attribute {attribute!r}")


def asarray(data: Any, dtype: Any = None) -> Any:
    """Copy ``data`` to the current CUDA device (no copy when it already lives there)."""
    return require().asarray(data, dtype=dtype)


def to_numpy(array: Any) -> Any:
    """Copy a device array back to host memory as a NumPy array."""
    return require().asnumpy(array)


def erf(array: Any) -> Any:
    """Elementwise error function computed on the GPU."""
    require()
    from cupyx.scipy import special as cupy_special

    return cupy_special.erf(array)


def gelu(array: Any, with_derivative: bool) -> Tuple[Any, Optional[Any]]:
    """Exact GELU and, if ``with_derivative``, its derivative (``special.gelu`` with CuPy's erf);
    float32 GELU normally runs in the fused CUDA kernels instead."""
    return special.gelu(array, require(), with_derivative, erf)


def layer_norm(x: Any, weight: Optional[Any], bias: Optional[Any], eps: float,
               keep: bool) -> tuple:
    """LayerNorm over the last axis (``row_ops.layer_norm``); float32 over the last dimension
    normally runs in the fused CUDA kernel instead."""
    return row_ops.layer_norm(x, weight, bias, eps, keep, require())


def layer_norm_backward(g: Any, normalized: Any, inv_std: Any, weight: Optional[Any],
                        need: Tuple[bool, bool, bool]) -> tuple:
    """``row_ops.layer_norm_backward``."""
    return row_ops.layer_norm_backward(g, normalized, inv_std, weight, need)


def softmax(x: Any, axis: int, causal_offset: Optional[int]) -> Any:
    """``row_ops.softmax``."""
    return row_ops.softmax(x, axis, causal_offset, require())


def softmax_backward(g: Any, out: Any, axis: int) -> Any:
    """``row_ops.softmax_backward``."""
    return row_ops.softmax_backward(g, out, axis)


def kernels() -> Any:
    """The fused CUDA kernels for arrays of this backend (``neural_arch.backends.cupy_kernels``:
    bias+GELU, softmax cross-entropy, LayerNorm, multi-tensor AdamW, gradient unscaling)."""
    from . import cupy_kernels
    return cupy_kernels
