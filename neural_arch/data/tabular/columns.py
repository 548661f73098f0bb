"""Reading a table's column as the preprocessor sees it: its kind (numerical or categorical),
its cells as numbers, and its categories as vocabulary keys in a fixed order.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .table import column_is_missing


def category_key(value: Any) -> str:
    """The vocabulary's spelling of a category: 3, 3.0 and "3" are one category."""
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(value)


def vocabulary_order(key: str) -> tuple:
    """Sort key of a vocabulary: numbers in numeric order, then text."""
    try:
        return (0, float(key), key)  # numbers in numeric order, before any text
    except ValueError:
        return (1, 0.0, key)


def is_number(value: Any) -> bool:
    """A cell holding a number (a boolean is a category, not a number)."""
    return isinstance(value, (int, float, np.integer, np.floating)) \
        and not isinstance(value, (bool, np.bool_))


def column_numbers(name: str, values: np.ndarray) -> np.ndarray:
    """A numeric column as float64 with NaN for missing cells; text is an error naming it."""
    if values.dtype.kind in "fiub":
        return values.astype(np.float64)
    missing = column_is_missing(values)
    out = np.full(values.shape, np.nan)
    for i, value in enumerate(values.tolist()):
        if missing[i]:
            continue
        try:
            out[i] = float(value)
        except (TypeError, ValueError):
            raise ValueError(f"numeric column {name!r} holds {value!r} (row {i}), which is not "
                             f"a number; list the column as categorical or clean it") from None
    return out


def infer_kind(values: np.ndarray) -> str:
    """"numerical" for a column of numbers (missing cells aside), else "categorical"."""
    if values.dtype.kind in "fiu":
        return "numerical"
    if values.dtype.kind == "O":
        present = [v for v, gone in zip(values.tolist(), column_is_missing(values)) if not gone]
        if present and all(is_number(v) for v in present):
            return "numerical"
    return "categorical"
