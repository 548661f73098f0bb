"""Matrix multiplication with NumPy's rules for 1-D, 2-D and batched N-D operands."""
from __future__ import annotations

from typing import Any

from ..backends import xp_of
from .autocast_state import autocast_inputs
from .bfloat16_compute import computes_bfloat16_in_float32
from .broadcast import unbroadcast
from .grad_mode import GRAD_MODE
from .ops_elementwise import operand
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry


def _shape_error(a: Any, b: Any) -> ValueError:
    a_shape, b_shape = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
    if not a_shape or not b_shape:
        return ValueError(f"matmul needs operands with at least 1 dimension, got shapes "
                          f"{a_shape} and {b_shape}")
    inner_b = b_shape[-2] if len(b_shape) > 1 else b_shape[0]
    if a_shape[-1] != inner_b:
        return ValueError(f"matmul shape mismatch: {a_shape} @ {b_shape} (inner dimensions "
                          f"{a_shape[-1]} and {inner_b} differ)")
    return ValueError(f"matmul shape mismatch: batch dimensions of {a_shape} and {b_shape} "
                      "do not broadcast")


def _matmul_data(ad: Any, bd: Any) -> Any:
    if getattr(ad, "ndim", 0) == 0 or getattr(bd, "ndim", 0) == 0:
        raise _shape_error(ad, bd)
    try:
        return ad @ bd
    except ValueError:
        raise _shape_error(ad, bd) from None


def _backward_general(g: Any, ad: Any, bd: Any, need_a: bool, need_b: bool) -> tuple:
    if ad.ndim == 1 and bd.ndim == 1:  # inner product: g is 0-d
        return (g * bd if need_a else None), (g * ad if need_b else None)
    xp = xp_of(g)
    a2 = ad if ad.ndim > 1 else ad[None, :]
    b2 = bd if bd.ndim > 1 else bd[:, None]
    g2 = g
    if ad.ndim == 1:
        g2 = xp.expand_dims(g2, -2)
    if bd.ndim == 1:
        g2 = xp.expand_dims(g2, -1)
    ga = gb = None
    if need_a:
        ga = g2 @ xp.swapaxes(b2, -1, -2)
        if ad.ndim == 1:
            ga = ga[..., 0, :]
        ga = unbroadcast(ga, ad.shape)
    if need_b:
        gb = xp.swapaxes(a2, -1, -2) @ g2
        if bd.ndim == 1:
            gb = gb[..., 0]
        gb = unbroadcast(gb, bd.shape)
    return ga, gb


@computes_bfloat16_in_float32("matmul")
def matmul(a: Tensor, b: Any) -> Tensor:
    """``a @ b``; shape mismatches raise ValueError naming both shapes."""
    a, b = autocast_inputs("matmul", a, b)
    bd, bt = operand(b, a)
    ad = a.array
    out = _matmul_data(ad, bd)
    need_a = a.requires_grad
    need_b = bt is not None and bt.requires_grad
    if not ((need_a or need_b) and GRAD_MODE.enabled):
        return _constant(out)
    # what the backward reads (b for a's gradient, a for b's), checked against in-place writes
    saved = ((saved_entry(bt),) if need_a and bt is not None else ()) + \
        ((saved_entry(a),) if need_b else ())
    if ad.ndim == 2 and bd.ndim == 2:
        def backward(g: Any) -> tuple:
            check_saved("MmBackward", saved)
            ga = g @ bd.T if need_a else None
            if bt is None:
                return (ga,)
            return ga, (ad.T @ g if need_b else None)
    else:
        def backward(g: Any) -> tuple:
            check_saved("MmBackward", saved)
            ga, gb = _backward_general(g, ad, bd, need_a, need_b)
            return (ga,) if bt is None else (ga, gb)
    return _node(out, (a,) if bt is None else (a, bt), backward)


def rmatmul(a: Tensor, b: Any) -> Tensor:
    """``b @ a`` for a non-tensor ``b``."""
    bd, _ = operand(b, a)
    return matmul(_constant(bd), a)
