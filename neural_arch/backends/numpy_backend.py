"""The reference backend: NumPy arrays on the CPU."""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import numpy

from . import special
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
