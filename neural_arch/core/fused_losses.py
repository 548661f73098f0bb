"""Classification losses fused into single graph nodes: cross_entropy and nll_loss.

Logits follow PyTorch's layout: (N, C) or (N, C, d1, ...) with integer targets (N, d1, ...);
1-D logits (C,) take a 0-d target. Internally everything is flattened to (M, C).
"""
from __future__ import annotations

from typing import Any, Callable, Tuple

import numpy as np

from ..backends import xp_of
from .autocast_state import autocast_inputs
from .bfloat16_compute import computes_bfloat16_in_float32
from .fused_activations import _NDARRAY, INT32_MAX, fused_ops, on_cuda_float32
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry

_REDUCTIONS = ("mean", "sum", "none")


def _as_array(value: Any, like: Any) -> Any:
    if isinstance(value, Tensor):
        return value.array
    return xp_of(like).asarray(value)


def _flatten_classes(data: Any) -> Tuple[Any, Callable[[Any], Any]]:
    """``data`` as (M, C) plus the inverse map for a gradient of that shape."""
    xp = xp_of(data)
    shape = data.shape
    if data.ndim == 2:
        return data, lambda g: g
    if data.ndim == 1:
        return data[None, :], lambda g: g.reshape(shape)
    moved = xp.moveaxis(data, 1, -1)
    moved_shape = moved.shape
    return (moved.reshape(-1, shape[1]),
            lambda g: xp.moveaxis(g.reshape(moved_shape), -1, 1))


def _check_common(op: str, inputs: Any, reduction: str) -> None:
    if reduction not in _REDUCTIONS:
        raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    if inputs.ndim < 1 or inputs.dtype.kind != "f":
        raise ValueError(f"{op}: input must be a floating tensor with a class dimension, got "
                         f"shape {inputs.shape} and dtype {inputs.dtype}")


def _check_class_target(op: str, inputs: Any, target: Any, ignore_index: int) -> Any:
    """Validate integer class targets; returns the mask of non-ignored entries, or None when
    every entry counts."""
    shape = inputs.shape
    expected = () if inputs.ndim == 1 else (shape[0],) + shape[2:]
    if tuple(target.shape) != expected:
        hint = ""
        if inputs.ndim >= 3 and tuple(target.shape) == shape[:-1]:
            hint = "; classes go on dimension 1, so flatten (N, T, C) logits to (N*T, C)"
        raise ValueError(f"{op}: target shape {tuple(target.shape)} does not match input shape "
                         f"{shape} (expected target shape {expected}; batch sizes "
                         f"{target.shape[0] if target.ndim else None} vs "
                         f"{shape[0] if inputs.ndim > 1 else None}){hint}")
    classes = shape[0] if inputs.ndim == 1 else shape[1]
    if target.size == 0:
        return None
    lowest, highest = int(target.min()), int(target.max())
    if 0 <= lowest and highest < classes and not lowest <= ignore_index <= highest:
        return None  # the common case: every target is a class and none is ignored
    valid = target != ignore_index
    bad = ((target < 0) | (target >= classes)) & valid
    if bad.any():
        value = target[bad].reshape(-1)[0].item()
        raise ValueError(f"{op}: target value {value} is out of range for {classes} classes "
                         f"(valid range 0..{classes - 1}, ignore_index={ignore_index})")
    return valid


def _saved_targets(target: Any) -> tuple:
    """The target's entry for ``versions.check_saved`` when it is a tensor: the backward
    reads it (torch checks it too; the logits are not read, their gradient is precomputed)."""
    return (saved_entry(target),) if isinstance(target, Tensor) else ()


def _reduce(per_item: Any, valid: Any, reduction: str, target_shape: tuple) -> Tuple[Any, Any]:
    """The reduced loss and the number of items a "mean" divides by."""
    if reduction == "none":
        return per_item.reshape(target_shape), None
    if reduction == "sum":
        return per_item.sum(), None
    # a Python int (not a NumPy integer) keeps the loss in the logits dtype
    count = int(valid.sum()) if valid is not None else per_item.shape[0]
    return per_item.sum() / count, count


def _row_scale(g: Any, reduction: str, count: Any) -> Any:
    if reduction == "none":
        return g.reshape(-1)
    return g / count if reduction == "mean" else g


def _use_fused_cross_entropy(ld: Any, td: Any, reduction: str, ignore_index: Any,
                             label_smoothing: Any) -> bool:
    """Whether the softmax cross-entropy kernel computes ``cross_entropy`` for logits array
    ``ld`` and target array ``td``: (rows, classes) logits, integer targets (rows,), and an
    ``ignore_index`` the kernel's int32 parameter holds."""
    return (on_cuda_float32(ld) and ld.ndim == 2 and 0 < ld.shape[1] <= INT32_MAX
            and ld.shape[0] <= INT32_MAX and reduction in _REDUCTIONS
            and td.dtype.kind in "iu" and tuple(td.shape) == (ld.shape[0],)
            and isinstance(ignore_index, (int, np.integer))
            and -INT32_MAX - 1 <= ignore_index <= INT32_MAX
            and isinstance(label_smoothing, (int, float, np.integer, np.floating))
            and 0.0 <= label_smoothing <= 1.0)


@computes_bfloat16_in_float32("cross_entropy")
def cross_entropy(logits: Tensor, target: Any, reduction: str = "mean", ignore_index: int = -100,
                  label_smoothing: float = 0.0) -> Tensor:
    """log_softmax + negative log-likelihood in one node; backward is softmax - onehot.

    Float32 GPU logits with integer targets run the fused CUDA kernel (see
    ``fused_activations.on_cuda_float32``)."""
    logits, target = autocast_inputs("cross_entropy", logits, target)
    ld = logits.array
    _check_common("cross_entropy", ld, reduction)
    if not 0.0 <= label_smoothing <= 1.0:
        raise ValueError(f"cross_entropy: label_smoothing must be in [0, 1], got {label_smoothing}")
    td = _as_array(target, ld)
    if type(ld) is not _NDARRAY and _use_fused_cross_entropy(ld, td, reduction, ignore_index,
                                                            label_smoothing):
        return fused_ops().fused_cross_entropy(logits, td, reduction, ignore_index,
                                               label_smoothing)
    if td.dtype.kind == "f":
        return _soft_cross_entropy(logits, td, reduction, label_smoothing,
                                   _saved_targets(target))
    if td.dtype.kind not in "iu":
        raise ValueError(f"cross_entropy: target must hold integer class indices or "
                         f"probabilities, got dtype {td.dtype}")
    valid = _check_class_target("cross_entropy", ld, td, ignore_index)
    xp = xp_of(ld)
    z2, unflatten = _flatten_classes(ld)
    rows_count, classes = z2.shape
    t = td.reshape(-1)
    all_valid = valid is None
    mask = None if all_valid else valid.reshape(-1)
    if not all_valid:
        t = xp.where(mask, t, 0)
    rows = xp.arange(rows_count)
    z = z2 - z2.max(axis=1, keepdims=True)
    picked = z[rows, t]
    mean_z = z.mean(axis=1) if label_smoothing else None
    e = xp.exp(z, out=z)
    s = e.sum(axis=1)
    log_s = xp.log(s)
    per_item = log_s - picked
    if label_smoothing:
        per_item = (1.0 - label_smoothing) * per_item + label_smoothing * (log_s - mean_z)
    if not all_valid:
        per_item = xp.where(mask, per_item, 0)
    out, count = _reduce(per_item, mask, reduction, td.shape)
    if not (logits.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    saved = _saved_targets(target)

    def backward(g: Any) -> tuple:
        check_saved("NllLossBackward", saved)
        scale = _row_scale(g, reduction, count)
        grad = e * (scale / s)[:, None]
        grad[rows, t] -= (1.0 - label_smoothing) * scale
        if label_smoothing:
            grad -= (label_smoothing / classes) * (scale[:, None] if scale.ndim else scale)
        if not all_valid:
            grad *= mask[:, None]
        return (unflatten(grad),)

    return _node(out, (logits,), backward)


def _soft_cross_entropy(logits: Tensor, probs: Any, reduction: str, smoothing: float,
                        saved: tuple) -> Tensor:
    ld = logits.array
    if probs.shape != ld.shape:
        raise ValueError(f"cross_entropy: probability target shape {probs.shape} must equal "
                         f"logits shape {ld.shape}")
    xp = xp_of(ld)
    z2, unflatten = _flatten_classes(ld)
    p, _ = _flatten_classes(probs)
    classes = z2.shape[1]
    if smoothing:
        p = (1.0 - smoothing) * p + smoothing / classes
    z = z2 - z2.max(axis=1, keepdims=True)
    log_probs = z - xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    per_item = -(p * log_probs).sum(axis=1)
    target_shape = (ld.shape[0],) + ld.shape[2:] if ld.ndim > 1 else ()
    out, count = _reduce(per_item, None, reduction, target_shape)
    if not (logits.requires_grad and GRAD_MODE.enabled):
        return _constant(out)

    def backward(g: Any) -> tuple:
        check_saved("CrossEntropyBackward", saved)
        scale = _row_scale(g, reduction, count)
        scale = scale[:, None] if scale.ndim else scale
        grad = xp.exp(log_probs) * p.sum(axis=1, keepdims=True) - p
        return (unflatten(grad * scale),)

    return _node(out, (logits,), backward)


@computes_bfloat16_in_float32("nll_loss")
def nll_loss(log_probs: Tensor, target: Any, reduction: str = "mean",
             ignore_index: int = -100) -> Tensor:
    """Mean (or sum) of ``-log_probs[i, target[i]]`` over non-ignored items."""
    log_probs, = autocast_inputs("nll_loss", log_probs)
    ld = log_probs.array
    _check_common("nll_loss", ld, reduction)
    td = _as_array(target, ld)
    if td.dtype.kind not in "iu":
        raise ValueError(f"nll_loss: target must hold integer class indices, got dtype {td.dtype}")
    valid = _check_class_target("nll_loss", ld, td, ignore_index)
    xp = xp_of(ld)
    lp2, unflatten = _flatten_classes(ld)
    rows = xp.arange(lp2.shape[0])
    all_valid = valid is None
    mask = None if all_valid else valid.reshape(-1)
    t = td.reshape(-1) if all_valid else xp.where(mask, td.reshape(-1), 0)
    per_item = -lp2[rows, t]
    if not all_valid:
        per_item = xp.where(mask, per_item, 0)
    out, count = _reduce(per_item, mask, reduction, td.shape)
    if not (log_probs.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    shape2 = lp2.shape
    saved = (saved_entry(log_probs),) + _saved_targets(target)  # torch saves both

    def backward(g: Any) -> tuple:
        check_saved("NllLossBackward", saved)
        scale = _row_scale(g, reduction, count)
        grad = xp.zeros(shape2, dtype=g.dtype)
        grad[rows, t] = -scale if all_valid else -scale * mask
        return (unflatten(grad),)

    return _node(out, (log_probs,), backward)
