"""Dtype rules: Python floats become float32, NumPy arrays keep their dtype, ints stay integer.

The floating dtypes are float16, float32, float64 and, with ``ml_dtypes`` installed, bfloat16
(``bfloat16.py``: a NumPy dtype of kind "V", so the kind alone does not tell).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .bfloat16 import BFLOAT16, MISSING_MESSAGE, is_missing_bfloat16
from .bfloat16 import bfloat16  # noqa: F401 - exported with the other dtype names

float16, float32, float64 = np.float16, np.float32, np.float64
int32, int64, bool_ = np.int32, np.int64, np.bool_

DEFAULT_FLOAT = np.dtype(np.float32)
_NAMES = {"float": "float32", "double": "float64", "half": "float16", "long": "int64",
          "int": "int32", "bool": "bool"}


def resolve_dtype(dtype: Any) -> np.dtype:
    """A NumPy dtype from a dtype object, a type, or a name like "float32" / "float"."""
    if isinstance(dtype, str):
        dtype = _NAMES.get(dtype, dtype)
    if is_missing_bfloat16(dtype):
        raise TypeError(MISSING_MESSAGE)
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise TypeError(f"unsupported dtype {dtype!r}") from exc


def is_floating(dtype: Any) -> bool:
    """True for floating dtypes (the only ones that can require grad), bfloat16 included."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or (BFLOAT16 is not None and dtype == BFLOAT16)


def default_dtype_for(array: Any) -> Any:
    """The dtype a freshly converted Python value should get (float64 -> float32)."""
    if array.dtype == np.float64:
        return DEFAULT_FLOAT
    return None
