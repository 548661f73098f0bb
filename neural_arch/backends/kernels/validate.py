"""Argument checks shared by the NumPy references and the CuPy wrappers (array-module agnostic).

Each check raises ValueError or TypeError naming the offending shapes, dtypes or values, and
returns what the caller needs next (row and column counts).
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

import numpy as np

APPROXIMATIONS = ("none", "tanh")


def approximate_mode(op: str, approximate: str) -> str:
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"{op}: approximate must be one of {APPROXIMATIONS}, got "
                         f"{approximate!r}")
    return approximate


def floating(op: str, what: str, array: Any) -> None:
    if np.dtype(array.dtype).kind != "f":
        raise TypeError(f"{op}: {what} must be a floating array, got dtype {array.dtype}")


def same_shape(op: str, what: str, array: Any, shape: Sequence[int]) -> None:
    if tuple(array.shape) != tuple(shape):
        raise ValueError(f"{op}: {what} has shape {tuple(array.shape)}, expected "
                         f"{tuple(shape)}")


def rows_and_features(op: str, x: Any) -> Tuple[int, int]:
    """(number of rows, last-dimension size) of an input with at least one dimension."""
    floating(op, "input", x)
    if x.ndim < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: input must have a non-empty last dimension, got shape "
                         f"{tuple(x.shape)}")
    features = int(x.shape[-1])
    return int(x.size) // features, features


def per_feature(op: str, what: str, vector: Optional[Any], features: int) -> None:
    if vector is not None:
        same_shape(op, what, vector, (features,))


def class_targets(op: str, logits: Any, target: Any) -> Tuple[int, int]:
    """(rows, classes) for 2-D logits and integer targets of shape (rows,)."""
    floating(op, "logits", logits)
    if logits.ndim != 2 or logits.shape[1] == 0:
        raise ValueError(f"{op}: logits must be 2-D (rows, classes) with classes > 0, got "
                         f"shape {tuple(logits.shape)}")
    if np.dtype(target.dtype).kind not in "iu":
        raise TypeError(f"{op}: target must hold integer class indices, got dtype "
                        f"{target.dtype}")
    rows, classes = int(logits.shape[0]), int(logits.shape[1])
    same_shape(op, "target", target, (rows,))
    return rows, classes


def target_values(op: str, target: Any, classes: int, ignore_index: int) -> None:
    """Raise when a target that is not ``ignore_index`` lies outside [0, classes)."""
    bad = ((target < 0) | (target >= classes)) & (target != ignore_index)
    if bool(bad.any()):
        value = int(target[bad].reshape(-1)[0])
        raise ValueError(f"{op}: target value {value} is out of range for {classes} classes "
                         f"(valid range 0..{classes - 1}, ignore_index={ignore_index})")


def label_smoothing(op: str, value: float) -> float:
    value = float(value)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{op}: label_smoothing must be in [0, 1], got {value}")
    return value


def tensor_lists(op: str, **lists: Sequence[Any]) -> int:
    """Equal-length lists of arrays whose entries have equal shapes position by position."""
    lengths = {name: len(items) for name, items in lists.items()}
    if len(set(lengths.values())) != 1:
        raise ValueError(f"{op}: tensor lists differ in length: {lengths}")
    names = list(lists)
    for i, group in enumerate(zip(*lists.values())):
        shape = group[0].shape
        if any(a.shape != shape for a in group):  # the dict only for the message: hot path
            shapes = {name: tuple(a.shape) for name, a in zip(names, group)}
            raise ValueError(f"{op}: tensor {i} has mismatched shapes {shapes}")
    return next(iter(lengths.values()))


def adam_hyper(op: str, step: int, lr: float, beta1: float, beta2: float, eps: float,
               weight_decay: float) -> None:
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise ValueError(f"{op}: step must be an integer >= 1, got {step!r}")
    if not 0.0 <= beta1 < 1.0 or not 0.0 <= beta2 < 1.0:
        raise ValueError(f"{op}: betas must lie in [0, 1), got ({beta1}, {beta2})")
    if lr < 0.0 or eps < 0.0 or weight_decay < 0.0:
        raise ValueError(f"{op}: lr, eps and weight_decay must be >= 0, got lr={lr}, "
                         f"eps={eps}, weight_decay={weight_decay}")
