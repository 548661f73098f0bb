"""Differentiable functions on tensors, in the style of ``torch.nn.functional``.

Hot paths (linear, cross_entropy, softmax, log_softmax, gelu, layer_norm, embedding, dropout,
nll_loss) are single graph nodes with hand-written backward passes (``neural_arch.core.fused_*``);
the rest are composed from Tensor operations.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .backends import xp_of
from .core.autocast_state import autocast_inputs
from .core.fused_activations import erf as _erf
from .core.fused_activations import causal_softmax, gelu, log_softmax, softmax
from .core.fused_layers import dropout, embedding, layer_norm, linear
from .core.fused_losses import cross_entropy, nll_loss
from .core.ops_batchnorm import batch_norm
from .core.ops_channel_dropout import dropout2d
from .core.ops_conv import conv1d, conv2d
from .core.ops_elementwise import operand
from .core.ops_pool import adaptive_avg_pool2d, avg_pool2d, max_pool2d
from .core.ops_shape import where
from .core.tensor import Tensor

_REDUCTIONS = ("mean", "sum", "none")

__all__ = [
    "linear", "relu", "relu_", "gelu", "tanh", "sigmoid", "silu", "erf", "softmax", "log_softmax",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits",
    "layer_norm", "dropout", "embedding", "scaled_dot_product_attention", "where",
    "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm",
    "dropout2d",
]


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def relu(x: Any, inplace: bool = False) -> Tensor:
    """``inplace=True`` writes into ``x`` (torch's ``relu_``) and returns it."""
    return relu_(x) if inplace else _tensor(x).relu()


def relu_(x: Tensor) -> Tensor:
    return x.relu_()


def tanh(x: Any) -> Tensor:
    return _tensor(x).tanh()


def sigmoid(x: Any) -> Tensor:
    return _tensor(x).sigmoid()


def silu(x: Any) -> Tensor:
    """x * sigmoid(x)."""
    x = _tensor(x)
    return x * x.sigmoid()


def erf(x: Any) -> Tensor:
    """Elementwise error function."""
    return _erf(_tensor(x))


def _reduce(loss: Tensor, reduction: str, op: str) -> Tensor:
    if reduction == "mean":
        return loss.mean()
    if reduction == "sum":
        return loss.sum()
    if reduction == "none":
        return loss
    raise ValueError(f"{op}: reduction must be one of {_REDUCTIONS}, got {reduction!r}")


def _same_shape(op: str, input: Tensor, target: Any) -> Any:
    target_data, target_tensor = operand(target, input)
    shape = tuple(getattr(target_data, "shape", ()))
    if shape != input.array.shape:
        raise ValueError(f"{op}: input shape {input.array.shape} and target shape {shape} differ")
    return target_tensor if target_tensor is not None else target_data


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean squared error; input and target shapes must match exactly."""
    input, target = autocast_inputs("mse_loss", input, target)
    diff = input - _same_shape("mse_loss", input, target)
    return _reduce(diff * diff, reduction, "mse_loss")


def l1_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean absolute error; input and target shapes must match exactly."""
    input, target = autocast_inputs("l1_loss", input, target)
    return _reduce((input - _same_shape("l1_loss", input, target)).abs(), reduction, "l1_loss")


def binary_cross_entropy_with_logits(logits: Tensor, target: Any,
                                     reduction: str = "mean") -> Tensor:
    """BCE on raw scores, computed as max(z, 0) - z*y + log(1 + exp(-|z|))."""
    logits, target = autocast_inputs("binary_cross_entropy_with_logits", logits, target)
    target = _same_shape("binary_cross_entropy_with_logits", logits, target)
    loss = logits.relu() - logits * target + ((-logits.abs()).exp() + 1.0).log()
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def scaled_dot_product_attention(query: Tensor, key: Tensor, value: Tensor, attn_mask: Any = None,
                                 dropout_p: float = 0.0, is_causal: bool = False,
                                 scale: Optional[float] = None, enable_gqa: bool = False, *,
                                 causal: bool = False, mask: Any = None, training: bool = True,
                                 rng: Any = None) -> Tensor:
    """softmax(query @ key^T * scale + mask) @ value over the last two dims of (..., L, E)
    tensors, with ``torch.nn.functional.scaled_dot_product_attention``'s signature.

    ``attn_mask``: boolean (True = may attend) or additive float, broadcastable to (..., L, S).
    ``is_causal``: query i attends to keys <= i (top-left aligned; an error with ``attn_mask``,
    both as PyTorch). A row no key may attend to gives zeros (and zero gradients), as PyTorch.
    ``scale`` defaults to 1/sqrt(E). Dropout on the weights applies whenever ``dropout_p`` > 0
    (pass 0 outside training, as with PyTorch). Keyword-only extras: ``causal`` (the causal mask
    aligned bottom-right, for queries that are the last L of S positions; it combines with a
    mask), ``mask`` (another name
    for ``attn_mask``), ``training=False`` (skips dropout), ``rng`` (what dropout draws from;
    default the global generator, see ``dropout``).
    """
    q, k, v = _tensor(query), _tensor(key), _tensor(value)
    if q.array.shape[-1] != k.array.shape[-1] or k.array.shape[-2] != v.array.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: incompatible shapes query "
                         f"{q.array.shape}, key {k.array.shape}, value {v.array.shape}")
    if enable_gqa and q.array.shape[-3:-2] != k.array.shape[-3:-2]:
        raise NotImplementedError("scaled_dot_product_attention: enable_gqa with fewer key/value "
                                  f"heads than query heads (query {q.array.shape}, key "
                                  f"{k.array.shape}) is not supported")
    if mask is not None:
        if attn_mask is not None:
            raise TypeError("scaled_dot_product_attention: pass attn_mask or mask, not both")
        attn_mask = mask
    if is_causal and (causal or attn_mask is not None):
        raise RuntimeError("scaled_dot_product_attention: an explicit attn_mask (or causal) "
                           "should not be set when is_causal=True")
    scale = 1.0 / math.sqrt(q.array.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    length, source = scores.array.shape[-2], scores.array.shape[-1]
    offset = 0 if is_causal else (source - length if causal else None)
    if attn_mask is None:
        # The causal mask folds into the softmax: no mask array, no masked_fill pass.
        weights = softmax(scores, axis=-1) if offset is None else causal_softmax(scores, offset)
    else:
        weights = _masked_softmax(scores, attn_mask, offset)
    if dropout_p:
        weights = dropout(weights, dropout_p, training, rng=rng)
    return weights @ v


def _masked_softmax(scores: Tensor, attn_mask: Any, causal_offset: Optional[int]) -> Tensor:
    """softmax over the last axis after the causal and the given mask; rows left with no key
    give zero weights (PyTorch's safe softmax) instead of NaN."""
    xp = xp_of(scores.array)
    mask_data = attn_mask.array if isinstance(attn_mask, Tensor) else xp.asarray(attn_mask)
    try:
        fits = xp.broadcast_shapes(mask_data.shape, scores.array.shape) == scores.array.shape
    except ValueError:
        fits = False
    if not fits:
        raise ValueError(f"scaled_dot_product_attention: attn_mask of shape "
                         f"{tuple(mask_data.shape)} does not broadcast to the scores' "
                         f"(..., L, S) shape {tuple(scores.array.shape)}")
    if causal_offset is not None:
        length, source = scores.array.shape[-2:]
        allowed = xp.tril(xp.ones((length, source), dtype=bool), k=causal_offset)
        scores = scores.masked_fill(~allowed, -math.inf)
    if mask_data.dtype.kind == "b":
        scores = scores.masked_fill(~mask_data, -math.inf)
    else:
        scores = scores + attn_mask
    dead = xp.isneginf(scores.array).all(axis=-1, keepdims=True)
    if not dead.any():
        return softmax(scores, axis=-1)
    return softmax(scores.masked_fill(dead, 0.0), axis=-1).masked_fill(dead, 0.0)
