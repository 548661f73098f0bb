"""The reference backend: NumPy arrays on the CPU."""
from __future__ import annotations

from typing import Any

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


def erf(array: numpy.ndarray) -> numpy.ndarray:
    """Elementwise error function, accurate to a few ulps in float64."""
    return special.erf(array, numpy)
