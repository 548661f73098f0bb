"""Differentiable functions on tensors, in the style of ``torch.nn.functional``.

Hot paths (linear, cross_entropy, softmax, log_softmax, gelu, layer_norm, embedding, dropout,
nll_loss) are single graph nodes with hand-written backward passes (``neural_arch.core.fused_*``);
the rest are composed from Tensor operations.
"""
from __future__ import annotations

import math
from typing import Any, Optional

from .backends import xp_of
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
    "linear", "relu", "gelu", "tanh", "sigmoid", "silu", "erf", "softmax", "log_softmax",
    "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "binary_cross_entropy_with_logits",
    "layer_norm", "dropout", "embedding", "scaled_dot_product_attention", "where",
    "conv1d", "conv2d", "max_pool2d", "avg_pool2d", "adaptive_avg_pool2d", "batch_norm",
    "dropout2d",
]


def _tensor(x: Any) -> Tensor:
    return x if isinstance(x, Tensor) else Tensor(x)


def relu(x: Any) -> Tensor:
    return _tensor(x).relu()


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
    if shape != input.data.shape:
        raise ValueError(f"{op}: input shape {input.data.shape} and target shape {shape} differ")
    return target_tensor if target_tensor is not None else target_data


def mse_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean squared error; input and target shapes must match exactly."""
    diff = input - _same_shape("mse_loss", input, target)
    return _reduce(diff * diff, reduction, "mse_loss")


def l1_loss(input: Tensor, target: Any, reduction: str = "mean") -> Tensor:
    """Mean absolute error; input and target shapes must match exactly."""
    return _reduce((input - _same_shape("l1_loss", input, target)).abs(), reduction, "l1_loss")


def binary_cross_entropy_with_logits(logits: Tensor, target: Any,
                                     reduction: str = "mean") -> Tensor:
    """BCE on raw scores, computed as max(z, 0) - z*y + log(1 + exp(-|z|))."""
    target = _same_shape("binary_cross_entropy_with_logits", logits, target)
    loss = logits.relu() - logits * target + ((-logits.abs()).exp() + 1.0).log()
    return _reduce(loss, reduction, "binary_cross_entropy_with_logits")


def scaled_dot_product_attention(q: Tensor, k: Tensor, v: Tensor, causal: bool = False,
                                 mask: Any = None, scale: Optional[float] = None,
                                 dropout_p: float = 0.0, training: bool = True,
                                 rng: Any = None) -> Tensor:
    """softmax(q @ k^T * scale + mask) @ v over the last two dims of (..., L, E) tensors.

    ``mask``: boolean (True = may attend, as in PyTorch) or additive float, broadcastable to
    (..., L, S). ``causal=True`` lets position i attend to positions <= i. ``rng``: what the
    attention weights' dropout draws from (default: the global generator; see ``dropout``).
    """
    if q.data.shape[-1] != k.data.shape[-1] or k.data.shape[-2] != v.data.shape[-2]:
        raise ValueError(f"scaled_dot_product_attention: incompatible shapes q {q.data.shape}, "
                         f"k {k.data.shape}, v {v.data.shape}")
    scale = 1.0 / math.sqrt(q.data.shape[-1]) if scale is None else scale
    scores = (q @ k.transpose(-2, -1)) * scale
    length, source = scores.data.shape[-2], scores.data.shape[-1]
    mask_data = mask.data if isinstance(mask, Tensor) else mask
    boolean = getattr(mask_data, "dtype", None) is not None and mask_data.dtype.kind == "b"
    # The causal mask folds into the softmax (no mask array, no masked_fill pass) unless an
    # additive mask follows it, whose -inf + inf = NaN the composed form must keep.
    fold = causal and (mask is None or boolean)
    if causal and not fold:
        xp = xp_of(scores.data)
        allowed = xp.tril(xp.ones((length, source), dtype=bool), k=source - length)
        scores = scores.masked_fill(~allowed, -math.inf)
    if mask is not None:
        if boolean:
            scores = scores.masked_fill(~mask_data, -math.inf)
        else:
            scores = scores + mask
    weights = causal_softmax(scores, source - length) if fold else softmax(scores, axis=-1)
    if dropout_p:
        weights = dropout(weights, dropout_p, training, rng=rng)
    return weights @ v
