"""LayerNorm and softmax over the last axis, written with whole-array operations of any array
module ``xp`` (NumPy, CuPy): the forms every backend can run.

The NumPy backend replaces them with the one-pass kernels of ``norm_softmax_kernels`` when Numba
runs; these stay its fallback and the reference the kernels are tested against. Each function
returns what its backward needs, so that the front end records the same graph whichever runs.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple


def layer_norm(x: Any, weight: Optional[Any], bias: Optional[Any], eps: float, keep: bool,
               xp: Any) -> Tuple[Any, Optional[Any], Optional[Any]]:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last axis of ``x``.

    Returns ``(out, normalized, inv_std)``; the last two (``inv_std`` of shape
    ``x.shape[:-1] + (1,)``) only when ``keep``, else None."""
    centered = x - x.mean(axis=-1, keepdims=True)
    inv_std = 1.0 / xp.sqrt((centered * centered).mean(axis=-1, keepdims=True) + eps)
    normalized = centered * inv_std
    out = normalized
    if weight is not None:
        out = out * weight
    if bias is not None:
        out = out + bias
    return (out, normalized, inv_std) if keep else (out, None, None)


def layer_norm_backward(g: Any, normalized: Any, inv_std: Any, weight: Optional[Any],
                        need: Tuple[bool, bool, bool]) -> Tuple[Any, Any, Any]:
    """Gradients ``(dx, dweight, dbias)`` of ``layer_norm`` from the output gradient ``g``;
    ``need`` says which to compute (the others are None). ``dweight`` and ``dbias`` have the
    shape of the last axis."""
    need_x, need_w, need_b = need
    gx = gw = gb = None
    if need_x:
        g_norm = g * weight if weight is not None else g
        gx = g_norm - g_norm.mean(axis=-1, keepdims=True)
        gx -= normalized * (g_norm * normalized).mean(axis=-1, keepdims=True)
        gx *= inv_std
    cols = g.shape[-1]
    if need_w:
        gw = (g * normalized).reshape(-1, cols).sum(axis=0)
    if need_b:
        gb = g.reshape(-1, cols).sum(axis=0)
    return gx, gw, gb


def causal_mask(xp: Any, rows: int, cols: int, offset: int) -> Any:
    """True where column j of row i lies in the future: j > i + offset."""
    return xp.triu(xp.ones((rows, cols), dtype=bool), k=offset + 1)


def softmax(x: Any, axis: int, causal_offset: Optional[int], xp: Any) -> Any:
    """exp(x) / sum(exp(x)) along ``axis``, after subtracting the max. With ``causal_offset``
    (``axis`` is then the last), entries j > i + offset of each (i, j) matrix in the last two
    axes count as -inf: weight 0, and a row with no entry left is NaN."""
    if causal_offset is not None:
        mask = causal_mask(xp, x.shape[-2], x.shape[-1], causal_offset)
        x = xp.where(mask, xp.asarray(-xp.inf, dtype=x.dtype), x)
    out = x - x.max(axis=axis, keepdims=True)
    xp.exp(out, out=out)
    out /= out.sum(axis=axis, keepdims=True)
    return out


def softmax_backward(g: Any, out: Any, axis: int) -> Any:
    """Gradient of ``softmax`` (causal or not) at its output ``out``: out * (g - sum(g out))."""
    weighted = g * out
    weighted -= out * weighted.sum(axis=axis, keepdims=True)
    return weighted
