"""Batch normalisation over every dimension but the channels (dim 1), torch's ``batch_norm``.

Training normalises with the batch's mean and biased variance in one graph node with its own
backward; the running estimates are updated with the unbiased variance, as torch. Evaluation
(or any call with fixed statistics) is a per-channel affine map.

Two seams serve a synchronised variant (statistics over every process of a group):
``statistics(x, axes) -> (mean, biased var, count)`` computes the batch statistics, and
``reduce_sums(sums) -> sums`` turns the per-channel gradient sums of the input gradient
(shape (2, C): sum of g, sum of g * x_hat) into the group's sums. The defaults are local.

On the CPU with Numba, C-contiguous float32/float64 inputs of rank 3 or more take the
one-channel-at-a-time kernels of ``backends.batchnorm_kernels`` (statistics and output in one
pass over memory; the backward recomputes the normalised input instead of keeping it);
elsewhere (CuPy, ``NEURAL_ARCH_NUMBA=0``, other dtypes) the NumPy form below runs.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import numpy as np

from ..backends import xp_of
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry

Statistics = Callable[[Any, Tuple[int, ...]], Tuple[Any, Any, int]]
SAVED_BY = "NativeBatchNormBackward"


def reduced_axes(op: str, xd: Any) -> Tuple[int, ...]:
    if xd.ndim < 2:
        raise ValueError(f"{op}: expected an input of shape (N, C, ...), got {tuple(xd.shape)}")
    return (0,) + tuple(range(2, xd.ndim))


_kernels: Any = None  # backends.batchnorm_kernels when Numba runs, else False; on first use


def channel_kernels(xd: Any, *params: Any) -> Any:
    """``batchnorm_kernels`` when they can take ``xd`` (a C-contiguous NumPy float32/float64
    array of rank >= 3, not empty) and ``params`` (arrays of its dtype or None), else None."""
    global _kernels
    if not (isinstance(xd, np.ndarray) and xd.ndim >= 3 and xd.size and xd.flags.c_contiguous):
        return None
    if _kernels is None:
        from ..backends import batchnorm_kernels
        _kernels = batchnorm_kernels if batchnorm_kernels.available() else False
    if not _kernels or xd.dtype not in _kernels.DTYPES:
        return None
    if any(p is not None and not (isinstance(p, np.ndarray) and p.dtype == xd.dtype)
           for p in params):
        return None
    return _kernels


def local_statistics(xd: Any, axes: Tuple[int, ...]) -> Tuple[Any, Any, int]:
    """Per-channel mean, biased variance (two passes, for accuracy) and element count."""
    count = xd.size // xd.shape[1]
    kernels = channel_kernels(xd)
    if kernels is not None and axes == reduced_axes("batch_norm", xd):
        mean, var = kernels.statistics(xd)
        return mean, var, count
    mean = xd.mean(axis=axes)
    centered = xd - mean.reshape(_channel_shape(xd))
    return mean, (centered * centered).mean(axis=axes), count


def _channel_shape(xd: Any) -> Tuple[int, ...]:
    return (1, xd.shape[1]) + (1,) * (xd.ndim - 2)


def _check_params(op: str, xd: Any, weight: Optional[Tensor], bias: Optional[Tensor]) -> None:
    for label, p in (("weight", weight), ("bias", bias)):
        if p is not None and tuple(p.array.shape) != (xd.shape[1],):
            raise ValueError(f"{op}: {label} shape {tuple(p.array.shape)} does not match the "
                             f"{xd.shape[1]} channels of input shape {tuple(xd.shape)}")


def saved_entries(x: Tensor, weight: Optional[Tensor], running: Sequence[Any]) -> tuple:
    """What the backward checks against in-place writes, as torch saves it: the input, the
    weight and the running statistics (the bias is not read)."""
    tensors = (x, weight) + tuple(running)
    return tuple(saved_entry(t) for t in tensors if isinstance(t, Tensor))


Gradients = Callable[[Any], Tuple[Any, Any, Any]]


def _graph_node(out: Any, x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                running: Sequence[Any], gradients: Gradients) -> Tensor:
    """``out`` as the output of one batch-norm node over ``x``, ``weight`` and ``bias`` (a
    constant when none of them wants a gradient). ``gradients(g)`` gives (input gradient,
    per-channel sum of g, per-channel sum of g * x_hat): the bias's and the weight's gradients;
    each may be None where its tensor does not want one. The backward first checks the saved
    tensors (``saved_entries``) against in-place writes."""
    parents = tuple(t for t in (x, weight, bias) if t is not None)
    if not (GRAD_MODE.enabled and any(t.requires_grad for t in parents)):
        return _constant(out)
    saved = saved_entries(x, weight, running)

    def backward(g: Any) -> tuple:
        check_saved(SAVED_BY, saved)
        grad_input, sum_g, sum_g_hat = gradients(g)
        grads = [grad_input if x.requires_grad else None]
        if weight is not None:
            grads.append(sum_g_hat if weight.requires_grad else None)
        if bias is not None:
            grads.append(sum_g if bias.requires_grad else None)
        return tuple(grads)

    return _node(out, parents, backward)


def batch_norm_training(x: Tensor, weight: Optional[Tensor], bias: Optional[Tensor],
                        eps: float, statistics: Statistics = local_statistics,
                        reduce_sums: Optional[Callable[[Any], Any]] = None,
                        running: Sequence[Optional[Tensor]] = ()
                        ) -> Tuple[Tensor, Any, Any, int]:
    """Normalise with the batch's statistics: (output, mean, biased var, count).
    ``running``: the running statistics the caller updates, which the backward checks against
    in-place writes as torch's does (it does not read them)."""
    op = "batch_norm"
    xd = x.array
    axes = reduced_axes(op, xd)
    _check_params(op, xd, weight, bias)
    kernels = channel_kernels(xd, *(None if p is None else p.array for p in (weight, bias)))
    if kernels is not None:
        return _training_with_kernels(kernels, x, weight, bias, eps, statistics, reduce_sums,
                                      running)
    mean, var, count = statistics(xd, axes)
    _check_count(xd, count)
    shape = _channel_shape(xd)
    inv_std = 1.0 / (var + eps) ** 0.5
    normalized = (xd - mean.reshape(shape)) * inv_std.reshape(shape)
    wd = None if weight is None else weight.array.reshape(shape)
    out = normalized if wd is None else normalized * wd
    if bias is not None:
        out = out + bias.array.reshape(shape)

    def gradients(g: Any) -> Tuple[Any, Any, Any]:
        sum_g = g.sum(axis=axes)
        sum_g_hat = (g * normalized).sum(axis=axes)
        if not x.requires_grad:
            return None, sum_g, sum_g_hat
        sums = xp_of(g).stack([sum_g, sum_g_hat])
        if reduce_sums is not None:
            sums = reduce_sums(sums)
        scale = inv_std if wd is None else inv_std * wd.reshape(-1)
        gx = (g - (sums[0] / count).reshape(shape)
              - normalized * (sums[1] / count).reshape(shape)) * scale.reshape(shape)
        return gx, sum_g, sum_g_hat

    return _graph_node(out, x, weight, bias, running, gradients), mean, var, count


def _training_with_kernels(kernels: Any, x: Tensor, weight: Optional[Tensor],
                           bias: Optional[Tensor], eps: float, statistics: Statistics,
                           reduce_sums: Optional[Callable[[Any], Any]],
                           running: Sequence[Optional[Tensor]]
                           ) -> Tuple[Tensor, Any, Any, int]:
    """``batch_norm_training`` through ``batchnorm_kernels``: the same values, fewer passes."""
    xd = x.array
    wd = None if weight is None else weight.array
    bd = None if bias is None else bias.array
    if statistics is local_statistics:  # statistics and output in one pass
        count = xd.size // xd.shape[1]
        _check_count(xd, count)
        out, mean, var, inv_std = kernels.forward(xd, wd, bd, eps)
    else:
        mean, var, count = statistics(xd, reduced_axes("batch_norm", xd))
        _check_count(xd, count)
        mean, var = np.asarray(mean, xd.dtype), np.asarray(var, xd.dtype)
        inv_std = (1.0 / (var + eps) ** 0.5).astype(xd.dtype)
        out = kernels.normalize(xd, mean, inv_std, wd, bd)

    def gradients(g: Any) -> Tuple[Any, Any, Any]:
        gx = None
        if x.requires_grad and reduce_sums is None:  # sums and gradient in one pass
            gx, local = kernels.backward(g, xd, mean, inv_std, wd, count)
        else:
            local = kernels.gradient_sums(g, xd, mean, inv_std)
        if x.requires_grad and reduce_sums is not None:
            sums = reduce_sums(local.copy())
            gx = kernels.input_gradient(g, xd, mean, inv_std, wd, sums, count)
        # each parameter's gradient its own array, not a view into the (2, C) sums
        return gx, local[0].copy(), local[1].copy()

    return _graph_node(out, x, weight, bias, running, gradients), mean, var, count


def _check_count(xd: Any, count: int) -> None:
    if count <= 1:
        raise ValueError(f"batch_norm: expected more than 1 value per channel when training, "
                         f"got input shape {tuple(xd.shape)}")


def batch_norm_fixed(x: Tensor, mean: Any, var: Any, weight: Optional[Tensor],
                     bias: Optional[Tensor], eps: float) -> Tensor:
    """Normalise with given per-channel statistics (evaluation): ``x * scale + shift``.
    ``mean`` and ``var``: arrays, or tensors (the running statistics), which the backward
    then checks against in-place writes as torch's does."""
    op = "batch_norm"
    running = (mean, var)
    mean, var = (t.array if isinstance(t, Tensor) else t for t in running)
    xd = x.array
    axes = reduced_axes(op, xd)
    _check_params(op, xd, weight, bias)
    shape = _channel_shape(xd)
    inv_std = (1.0 / (var + eps) ** 0.5).astype(xd.dtype)
    scale = inv_std if weight is None else inv_std * weight.array
    shift = -mean * scale if bias is None else bias.array - mean * scale
    out = xd * scale.reshape(shape) + shift.reshape(shape)

    def gradients(g: Any) -> Tuple[Any, Any, Any]:
        gx = g * scale.reshape(shape) if x.requires_grad else None
        sum_g = g.sum(axis=axes) if bias is not None and bias.requires_grad else None
        sum_g_hat = None
        if weight is not None and weight.requires_grad:
            normalized = (xd - mean.reshape(shape)) * inv_std.reshape(shape)
            sum_g_hat = (g * normalized).sum(axis=axes)
        return gx, sum_g, sum_g_hat

    return _graph_node(out, x, weight, bias, running, gradients)


def update_running(running_mean: Optional[Tensor], running_var: Optional[Tensor], mean: Any,
                   var: Any, count: int, momentum: float) -> None:
    """``running = (1 - momentum) * running + momentum * batch``, in place; the variance
    enters unbiased (times count / (count - 1)), as torch."""
    if running_mean is not None:
        running_mean.array *= 1.0 - momentum
        running_mean.array += (momentum * mean).astype(running_mean.array.dtype)
    if running_var is not None:
        running_var.array *= 1.0 - momentum
        running_var.array += (momentum * var * (count / (count - 1))).astype(
            running_var.array.dtype)


def batch_norm(input: Tensor, running_mean: Optional[Tensor], running_var: Optional[Tensor],
               weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               training: bool = False, momentum: float = 0.1, eps: float = 1e-5) -> Tensor:
    """torch's ``F.batch_norm``: batch statistics when ``training`` (updating the running
    ones in place when given), else the running statistics."""
    if training:
        out, mean, var, count = batch_norm_training(input, weight, bias, eps,
                                                    running=(running_mean, running_var))
        update_running(running_mean, running_var, mean, var, count, momentum)
        return out
    if running_mean is None or running_var is None:
        raise ValueError("batch_norm: running_mean and running_var are required when "
                         "training=False")
    return batch_norm_fixed(input, running_mean, running_var, weight, bias, eps)
