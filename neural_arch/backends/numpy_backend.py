"""The reference backend: NumPy arrays on the CPU."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy

from . import row_ops, special
from .allocator import tune_allocator

name = "numpy"
device = "cpu"
xp = numpy
array_type = numpy.ndarray
array_types = (numpy.ndarray, numpy.generic)

tune_allocator()


def is_available() -> bool:
    """NumPy is a hard dependency, so this backend is always usable."""
    return True


def asarray(data: Any, dtype: Any = None) -> numpy.ndarray:
    """``data`` (array, CuPy array, list, scalar) as a NumPy array, copying only if needed."""
    if hasattr(data, "__cuda_array_interface__") and hasattr(data, "get"):
        data = data.get()
    return numpy.asarray(data, dtype=dtype)


def to_numpy(array: Any) -> numpy.ndarray:
    """The array as a NumPy array (no copy for NumPy input)."""
    return numpy.asarray(array)


def numpy_forms() -> Tuple[Callable, Callable]:
    """(erf, gelu) written with NumPy operations: the forms used without Numba."""
    return (lambda array: special.erf(array, numpy),
            lambda array, with_derivative: special.gelu(array, numpy, with_derivative))


_forms: Optional[Tuple[Callable, Callable]] = None  # (erf, gelu), chosen on first use


def _chosen_forms() -> Tuple[Callable, Callable]:
    """The compiled kernels of ``erf_kernels`` when Numba runs (one pass over memory instead of
    about twenty), else ``numpy_forms()``. Chosen once, on first use: importing Numba takes a
    fraction of a second that a program without erf or GELU should not pay."""
    global _forms
    if _forms is None:
        from . import erf_kernels
        _forms = ((erf_kernels.erf, erf_kernels.gelu) if erf_kernels.available()
                  else numpy_forms())
    return _forms


def erf(array: numpy.ndarray) -> numpy.ndarray:
    """Elementwise error function, accurate to a few ulps in float64; keeps the dtype."""
    return (_forms or _chosen_forms())[0](array)


def gelu(array: numpy.ndarray, with_derivative: bool
         ) -> Tuple[numpy.ndarray, Optional[numpy.ndarray]]:
    """Exact GELU ``x * Phi(x)`` and, if ``with_derivative``, ``Phi(x) + x * phi(x)`` (the
    factor of its backward), else None; keeps the dtype."""
    return (_forms or _chosen_forms())[1](array, with_derivative)


# ----- LayerNorm and softmax over the last axis --------------------------------------------------
_row_kernels: Any = None  # norm_softmax_kernels when Numba runs, else False; chosen on first use


def _kernels_for(*arrays: Optional[numpy.ndarray]) -> Any:
    """``norm_softmax_kernels`` when Numba runs and the arrays (None: absent) share float32 or
    float64 and are not empty, else None (the ``row_ops`` forms then compute)."""
    global _row_kernels
    if _row_kernels is None:
        from . import norm_softmax_kernels
        _row_kernels = norm_softmax_kernels if norm_softmax_kernels.available() else False
    if not _row_kernels:
        return None
    dtype = arrays[0].dtype
    if dtype not in _row_kernels.DTYPES or arrays[0].size == 0:
        return None
    return _row_kernels if all(a is None or a.dtype == dtype for a in arrays) else None


def layer_norm(x: numpy.ndarray, weight: Optional[numpy.ndarray],
               bias: Optional[numpy.ndarray], eps: float, keep: bool) -> tuple:
    """LayerNorm over the last axis: ``(out, normalized, inv_std)``, the last two only when
    ``keep`` (what the backward needs), as ``row_ops.layer_norm``."""
    kernels = _kernels_for(x, weight, bias)
    if kernels is None:
        return row_ops.layer_norm(x, weight, bias, eps, keep, numpy)
    return kernels.layer_norm(x, weight, bias, eps, keep)


def layer_norm_backward(g: numpy.ndarray, normalized: numpy.ndarray, inv_std: numpy.ndarray,
                        weight: Optional[numpy.ndarray], need: Tuple[bool, bool, bool]) -> tuple:
    """``(dx, dweight, dbias)`` of ``layer_norm``, those ``need`` asks for (else None)."""
    kernels = _kernels_for(g, normalized, inv_std, weight)
    if kernels is None:
        return row_ops.layer_norm_backward(g, normalized, inv_std, weight, need)
    return kernels.layer_norm_backward(g, normalized, inv_std, weight, need)


def _last(array: numpy.ndarray, axis: int) -> bool:
    return array.ndim >= 1 and axis in (-1, array.ndim - 1)


def softmax(x: numpy.ndarray, axis: int, causal_offset: Optional[int]) -> numpy.ndarray:
    """Softmax along ``axis``; with ``causal_offset`` (``axis`` the last), entries j > i + offset
    of each matrix in the last two axes are masked, as ``row_ops.softmax``."""
    kernels = _kernels_for(x) if _last(x, axis) else None
    if kernels is None:
        return row_ops.softmax(x, axis, causal_offset, numpy)
    return kernels.softmax(x, causal_offset)


def softmax_backward(g: numpy.ndarray, out: numpy.ndarray, axis: int) -> numpy.ndarray:
    """Gradient of ``softmax`` at its output ``out``."""
    kernels = _kernels_for(g, out) if _last(g, axis) else None
    if kernels is None:
        return row_ops.softmax_backward(g, out, axis)
    return kernels.softmax_backward(g, out)
