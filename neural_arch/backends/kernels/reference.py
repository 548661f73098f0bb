"""NumPy float64 definitions of what every CUDA kernel computes.

These functions have the signatures of the GPU wrappers in ``neural_arch.backends.cupy_kernels``
and define their math: they compute in float64 and return float64 arrays (the in-place ones,
``adamw_step`` and ``unscale_and_check_inf``, store back in each array's own dtype). The GPU
tests compare the kernels against them; CPU tests check them against the framework's autograd.
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import numpy as np

from . import validate

_SQRT_HALF = math.sqrt(0.5)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)
_TANH_SCALE = math.sqrt(2.0 / math.pi)
_TANH_CUBIC = 0.044715
# math.erfc, not the framework's polynomial erf: the reference must not share code with the
# tested. Phi(v) = erfc(-v / sqrt 2) / 2 stays accurate in the negative tail, where 1 + erf is 0.
_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _normal_cdf(v: np.ndarray) -> np.ndarray:
    return 0.5 * _erfc(-v * _SQRT_HALF)


def _tanh_halves(v: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """((1 + tanh u) / 2, (1 - tanh u) / 2) for GELU's tanh argument u, as logistic functions
    (1 + tanh u cancels to 0 in the negative tail)."""
    u = _TANH_SCALE * (v + _TANH_CUBIC * v ** 3)
    e = np.exp(-2.0 * np.abs(u))
    big, small = 1.0 / (1.0 + e), e / (1.0 + e)
    return np.where(u >= 0, big, small), np.where(u >= 0, small, big)


def _f64(array: Any) -> np.ndarray:
    return np.asarray(array, dtype=np.float64)


def _biased(op: str, x: Any, bias: Optional[Any]) -> np.ndarray:
    _, features = validate.rows_and_features(op, x)
    validate.per_feature(op, "bias", bias, features)
    v = _f64(x)
    return v if bias is None else v + _f64(bias)


def bias_gelu_forward(x: Any, bias: Optional[Any] = None, approximate: str = "none") -> np.ndarray:
    """gelu(x + bias), bias broadcast over the last dimension."""
    validate.approximate_mode("bias_gelu_forward", approximate)
    v = _biased("bias_gelu_forward", x, bias)
    if approximate == "tanh":
        return v * _tanh_halves(v)[0]
    return v * _normal_cdf(v)


def bias_gelu_backward(grad_out: Any, x: Any, bias: Optional[Any] = None,
                       approximate: str = "none") -> Tuple[np.ndarray, Optional[np.ndarray]]:
    """(dL/dx, dL/dbias) of gelu(x + bias); dL/dbias is None without a bias."""
    validate.approximate_mode("bias_gelu_backward", approximate)
    v = _biased("bias_gelu_backward", x, bias)
    validate.same_shape("bias_gelu_backward", "grad_out", grad_out, x.shape)
    if approximate == "tanh":
        plus, minus = _tanh_halves(v)  # 1 - tanh^2 = 4 plus minus
        slope = plus + 2.0 * v * plus * minus * _TANH_SCALE * (1.0 + 3.0 * _TANH_CUBIC * v * v)
    else:
        slope = _normal_cdf(v) + v * _INV_SQRT_2PI * np.exp(-0.5 * v * v)
    grad = _f64(grad_out) * slope
    grad_bias = None if bias is None else grad.reshape(-1, v.shape[-1]).sum(axis=0)
    return grad, grad_bias


def _checked_targets(op: str, logits: Any, target: Any, ignore_index: int,
                     label_smoothing: float) -> Tuple[np.ndarray, np.ndarray]:
    _, classes = validate.class_targets(op, logits, target)
    validate.label_smoothing(op, label_smoothing)
    t = np.asarray(target).astype(np.int64)
    validate.target_values(op, t, classes, ignore_index)
    valid = t != ignore_index
    return np.where(valid, t, 0), valid


def cross_entropy_forward(logits: Any, target: Any, ignore_index: int = -100,
                          label_smoothing: float = 0.0) -> Tuple[np.ndarray, np.ndarray]:
    """(per-row loss, per-row logsumexp); ignored rows have loss 0."""
    t, valid = _checked_targets("cross_entropy_forward", logits, target, ignore_index,
                                label_smoothing)
    z = _f64(logits)
    row_max = z.max(axis=1, keepdims=True)
    lse = (row_max + np.log(np.exp(z - row_max).sum(axis=1, keepdims=True)))[:, 0]
    picked = z[np.arange(z.shape[0]), t]
    loss = (1.0 - label_smoothing) * (lse - picked)
    if label_smoothing:
        loss += label_smoothing * (lse - z.mean(axis=1))
    return np.where(valid, loss, 0.0), lse


def cross_entropy_backward(grad_loss: Any, logits: Any, target: Any, lse: Any,
                           ignore_index: int = -100, label_smoothing: float = 0.0,
                           check_targets: bool = True) -> np.ndarray:
    """dL/dlogits given dL/dloss per row (``grad_loss``, shape (rows,)). The targets are
    always checked here (``check_targets`` matters on the GPU, where a check syncs)."""
    t, valid = _checked_targets("cross_entropy_backward", logits, target, ignore_index,
                                label_smoothing)
    rows, classes = logits.shape
    validate.same_shape("cross_entropy_backward", "grad_loss", grad_loss, (rows,))
    validate.same_shape("cross_entropy_backward", "lse", lse, (rows,))
    grad = np.exp(_f64(logits) - _f64(lse)[:, None]) - label_smoothing / classes
    grad[np.arange(rows), t] -= 1.0 - label_smoothing
    return grad * np.where(valid, _f64(grad_loss), 0.0)[:, None]


def layer_norm_forward(x: Any, weight: Optional[Any] = None, bias: Optional[Any] = None,
                       eps: float = 1e-5) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(y, mean, rstd) normalising over the last dimension; mean and rstd have one entry per
    row (the input's leading dimensions flattened)."""
    rows, cols = validate.rows_and_features("layer_norm_forward", x)
    validate.per_feature("layer_norm_forward", "weight", weight, cols)
    validate.per_feature("layer_norm_forward", "bias", bias, cols)
    v = _f64(x).reshape(rows, cols)
    mean = v.mean(axis=1)
    centered = v - mean[:, None]
    rstd = 1.0 / np.sqrt((centered * centered).mean(axis=1) + eps)
    y = centered * rstd[:, None]
    if weight is not None:
        y = y * _f64(weight)
    if bias is not None:
        y = y + _f64(bias)
    return y.reshape(x.shape), mean, rstd


def layer_norm_backward(grad_out: Any, x: Any, weight: Optional[Any], mean: Any,
                        rstd: Any) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(dL/dx, dL/dweight, dL/dbias) from the mean and rstd the forward saved."""
    rows, cols = validate.rows_and_features("layer_norm_backward", x)
    validate.same_shape("layer_norm_backward", "grad_out", grad_out, x.shape)
    validate.per_feature("layer_norm_backward", "weight", weight, cols)
    validate.same_shape("layer_norm_backward", "mean", mean, (rows,))
    validate.same_shape("layer_norm_backward", "rstd", rstd, (rows,))
    g = _f64(grad_out).reshape(rows, cols)
    rs = _f64(rstd)[:, None]
    xhat = (_f64(x).reshape(rows, cols) - _f64(mean)[:, None]) * rs
    gh = g * _f64(weight) if weight is not None else g
    dx = rs * (gh - gh.mean(axis=1, keepdims=True)
               - xhat * (gh * xhat).mean(axis=1, keepdims=True))
    return dx.reshape(x.shape), (g * xhat).sum(axis=0), g.sum(axis=0)


def adamw_step(params: Sequence[Any], grads: Sequence[Any], exp_avgs: Sequence[Any],
               exp_avg_sqs: Sequence[Any], *, step: int, lr: float, beta1: float, beta2: float,
               eps: float, weight_decay: float, maximize: bool = False) -> None:
    """One AdamW step (PyTorch's rule, bias-corrected) on every tensor, in place."""
    validate.tensor_lists("adamw_step", params=params, grads=grads, exp_avgs=exp_avgs,
                          exp_avg_sqs=exp_avg_sqs)
    validate.adam_hyper("adamw_step", step, lr, beta1, beta2, eps, weight_decay)
    step_size = lr / (1.0 - beta1 ** step)
    bias_correction2_sqrt = math.sqrt(1.0 - beta2 ** step)
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs):
        g64 = -_f64(g) if maximize else _f64(g)
        m64 = _f64(m) + (g64 - _f64(m)) * (1.0 - beta1)
        v64 = _f64(v) * beta2 + (1.0 - beta2) * g64 * g64
        p64 = _f64(p) * (1.0 - lr * weight_decay)
        p64 -= step_size * m64 / (np.sqrt(v64) / bias_correction2_sqrt + eps)
        p[...], m[...], v[...] = p64, m64, v64


def unscale_and_check_inf(grads: Sequence[Any], inv_scale: float,
                          found_inf: Optional[Any] = None) -> np.ndarray:
    """Multiply every gradient by ``inv_scale`` in place; ``found_inf`` (a float32 array of
    shape (1,), created as 0 when None) becomes 1 if any element was inf or NaN beforehand."""
    flag = np.zeros(1, dtype=np.float32) if found_inf is None else found_inf
    validate.same_shape("unscale_and_check_inf", "found_inf", flag, (1,))
    for i, g in enumerate(grads):
        if np.dtype(g.dtype) not in (np.dtype(np.float16), np.dtype(np.float32)):
            raise TypeError(f"unscale_and_check_inf: gradient {i} has dtype {g.dtype}; float16 "
                            "and float32 are supported")
        values = _f64(g)
        if not np.isfinite(values).all():
            flag[...] = 1.0
        g[...] = values * inv_scale
    return flag


__all__: List[str] = [
    "adamw_step", "bias_gelu_backward", "bias_gelu_forward", "cross_entropy_backward",
    "cross_entropy_forward", "layer_norm_backward", "layer_norm_forward",
    "unscale_and_check_inf",
]
