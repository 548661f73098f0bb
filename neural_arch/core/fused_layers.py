"""Layer kernels with their own backward: linear, layer_norm, embedding, dropout."""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from ..backends import backend_for, xp_of
from .autocast_state import autocast_inputs
from .bfloat16_compute import computes_bfloat16_in_float32
from .fused_activations import _NDARRAY, INT32_MAX, fused_ops, on_cuda_float32
from .grad_mode import GRAD_MODE
from .ops_shape import index_add
from .random import get_rng
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry


@computes_bfloat16_in_float32("linear")
def linear(x: Tensor, weight: Tensor, bias: Optional[Tensor] = None) -> Tensor:
    """``x @ weight.T + bias`` with weight of shape (out_features, in_features)."""
    x, weight, bias = autocast_inputs("linear", x, weight, bias)
    xd, wd = x.array, weight.array
    if wd.ndim != 2 or xd.ndim < 1 or xd.shape[-1] != wd.shape[1]:
        raise ValueError(f"linear: input shape {xd.shape} does not match weight shape {wd.shape} "
                         f"(expected input (..., {wd.shape[1] if wd.ndim == 2 else '?'}))")
    in_features = wd.shape[1]
    # N-D input as one 2-D product: BLAS gets all rows in one call instead of NumPy's loop of
    # one call per leading index (10-25% faster at the GPT's shapes)
    x2 = xd if xd.ndim == 2 else xd.reshape(-1, in_features)
    out = x2 @ wd.T
    if xd.ndim != 2:
        out = out.reshape(xd.shape[:-1] + (wd.shape[0],))
    bd = None
    if bias is not None:
        bd = bias.array
        if bd.shape != (wd.shape[0],):
            raise ValueError(f"linear: bias shape {bd.shape} does not match weight shape "
                             f"{wd.shape} (expected ({wd.shape[0]},))")
        if bd.dtype == out.dtype:
            out += bd
        else:
            out = out + bd
    need_x, need_w = x.requires_grad, weight.requires_grad
    need_b = bias is not None and bias.requires_grad
    if not ((need_x or need_w or need_b) and GRAD_MODE.enabled):
        return _constant(out)
    # the weight is read for the input's gradient, the input for the weight's
    saved = ((saved_entry(weight),) if need_x else ()) + ((saved_entry(x),) if need_w else ())

    def backward(g: Any) -> tuple:
        check_saved("AddmmBackward", saved)
        g2 = g if g.ndim == 2 else g.reshape(-1, g.shape[-1])
        gx = None
        if need_x:
            gx = g2 @ wd
            if g.ndim != 2:
                gx = gx.reshape(g.shape[:-1] + (in_features,))
        gw = None
        if need_w:
            gw = g2.T @ x2
        if bias is None:
            return gx, gw
        return gx, gw, (g2.sum(axis=0) if need_b else None)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return _node(out, parents, backward)


def _use_fused_layer_norm(xd: Any, norm_shape: Tuple[int, ...], weight: Optional[Tensor],
                          bias: Optional[Tensor], eps: Any) -> bool:
    """Whether the LayerNorm kernel computes ``layer_norm`` for array ``xd``: it normalises
    over the last dimension only, and takes float32 GPU weight and bias of that length."""
    if not (on_cuda_float32(xd) and len(norm_shape) == 1 and xd.ndim >= 1):
        return False
    cols = xd.shape[-1]
    if norm_shape[0] != cols or not 0 < cols <= INT32_MAX or xd.size // cols > INT32_MAX:
        return False
    for p in (weight, bias):
        if p is not None and not (on_cuda_float32(p.array) and tuple(p.array.shape) == (cols,)):
            return False
    return isinstance(eps, (int, float, np.integer, np.floating)) and not isinstance(eps, bool)


@computes_bfloat16_in_float32("layer_norm")
def layer_norm(x: Tensor, normalized_shape: Union[int, Sequence[int]],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5) -> Tensor:
    """Normalise over the trailing ``normalized_shape`` dims, then scale and shift.

    Float32 GPU inputs normalised over their last dimension run the fused CUDA kernel (see
    ``fused_activations.on_cuda_float32``)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    norm_shape = tuple(normalized_shape)
    x, weight, bias = autocast_inputs("layer_norm", x, weight, bias)
    xd = x.array
    k = len(norm_shape)
    if k == 0 or tuple(xd.shape[xd.ndim - k:]) != norm_shape or xd.ndim < k:
        raise ValueError(f"layer_norm: normalized_shape {norm_shape} does not match the trailing "
                         f"dimensions of input shape {xd.shape}")
    for label, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.array.shape) != norm_shape:
            raise ValueError(f"layer_norm: {label} shape {p.array.shape} must equal "
                             f"normalized_shape {norm_shape}")
    if type(xd) is not _NDARRAY and _use_fused_layer_norm(xd, norm_shape, weight, bias, eps):
        return fused_ops().fused_layer_norm(x, norm_shape, weight, bias, eps)
    # The backend normalises over the last axis (one pass per row with the compiled CPU
    # kernels): trailing dimensions of a multi-dimensional normalized_shape become one.
    backend = backend_for(xd)
    cols = math.prod(norm_shape)
    flat = xd if k == 1 else xd.reshape(xd.shape[:xd.ndim - k] + (cols,))
    wd = None if weight is None else weight.array.reshape(cols)
    bd = None if bias is None else bias.array.reshape(cols)
    parents = tuple(t for t in (x, weight, bias) if t is not None)
    record = GRAD_MODE.enabled and any(t.requires_grad for t in parents)
    out, normalized, inv_std = backend.layer_norm(flat, wd, bd, eps, record)
    out = out.reshape(xd.shape)
    if not record:
        return _constant(out)
    need = (x.requires_grad, weight is not None and weight.requires_grad,
            bias is not None and bias.requires_grad)
    saved = tuple(saved_entry(t) for t in parents)  # torch saves the bias too

    def backward(g: Any) -> tuple:
        check_saved("NativeLayerNormBackward", saved)
        gx, gw, gb = backend.layer_norm_backward(g.reshape(flat.shape), normalized, inv_std, wd,
                                                 need)
        grads = [None if gx is None else gx.reshape(xd.shape)]
        if weight is not None:
            grads.append(None if gw is None else gw.reshape(norm_shape))
        if bias is not None:
            grads.append(None if gb is None else gb.reshape(norm_shape))
        return tuple(grads)

    return _node(out, parents, backward)


def embedding(indices: Any, weight: Tensor) -> Tensor:
    """Rows of ``weight`` (num_embeddings, dim) picked by integer ``indices``."""
    idx = indices.array if isinstance(indices, Tensor) else xp_of(weight.array).asarray(indices)
    wd = weight.array
    if idx.dtype.kind not in "iu":
        raise ValueError(f"embedding: indices must be integers, got dtype {idx.dtype}")
    if wd.ndim != 2:
        raise ValueError(f"embedding: weight must be 2-D (num_embeddings, dim), got {wd.shape}")
    if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= wd.shape[0]):
        value = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
        raise ValueError(f"embedding: index {value} is out of range for {wd.shape[0]} embeddings")
    out = wd[idx]
    if not (weight.requires_grad and GRAD_MODE.enabled):
        return _constant(out)
    # the backward reads the indices (not the weight), as torch's, which checks them
    saved = (saved_entry(indices),) if isinstance(indices, Tensor) else ()

    def backward(g: Any) -> tuple:
        check_saved("EmbeddingBackward", saved)
        xp = xp_of(g)
        grad = xp.zeros(wd.shape, dtype=g.dtype)
        index_add(xp, grad, idx.reshape(-1), g.reshape(-1, wd.shape[1]))
        return (grad,)

    return _node(out, (weight,), backward)


def dropout(x: Tensor, p: float = 0.5, training: bool = True, rng: Any = None) -> Tensor:
    """Zero each element with probability ``p`` and scale the rest by 1 / (1 - p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0.0:
        return x
    xd = x.array
    xp = xp_of(xd)
    if p == 1.0:
        mask = xp.zeros(xd.shape, dtype=xd.dtype)
    else:
        generator = rng if rng is not None else get_rng()
        precision = "float32" if xd.dtype.itemsize <= 4 else "float64"
        draws = generator.random(xd.shape, dtype=precision)
        mask = (xp.asarray(draws) >= p).astype(xd.dtype)
        mask *= 1.0 / (1.0 - p)
    out = xd * mask
    if x.requires_grad and GRAD_MODE.enabled:
        return _node(out, (x,), lambda g: (g * mask,))
    return _constant(out)
