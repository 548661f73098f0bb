"""Convolution over 1 or 2 spatial dimensions (``conv1d``, ``conv2d``) as im2col + matmul.

On the CPU (NumPy arrays) ``conv_cpu`` computes it a span of samples at a time, with columns
that stay in cache and none kept for the backward (stride 1: ``conv_wide``, whose input
gradient is itself a convolution; strided: ``conv_strided``). When only the weight and bias
need a gradient (a first layer, whose few column rows are cheaper kept than rebuilt) it keeps
the whole batch's columns, the bias folded into the product (``conv_kept_columns``).
Elsewhere (CuPy, a grouped first layer, a stride-1 padding wider than the kernel whose input
needs a gradient), the forward below builds the (N, C * kh * kw, Ho * Wo) column matrix of
the whole batch once (``conv_windows.im2col``) and multiplies each group's weight by it: one
product per sample, whose output is already in NCHW order; the backward reuses the columns
for the weight gradient and adds the columns' gradient back into the input (``col2im``). A
1-D convolution is the 2-D one with a height of 1.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

import numpy as np

from ..backends import xp_of
from . import conv_cpu, conv_kept_columns
from .autocast_state import autocast_inputs
from .conv_windows import col2im, im2col
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry

IntOrPair = Union[int, Sequence[int]]
PADDING_STRINGS = ("same", "valid")


def expand_param(value: Any, dims: int, name: str, op: str, minimum: int) -> Tuple[int, ...]:
    """``value`` (an int or a sequence of ``dims`` ints) as a ``dims``-tuple, each >= minimum."""
    items = tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
    if len(items) != dims or not all(isinstance(v, int) and not isinstance(v, bool)
                                     for v in items):
        raise ValueError(f"{op}: {name} must be an int or {dims} ints, got {value!r}")
    if any(v < minimum for v in items):
        raise ValueError(f"{op}: {name} must be >= {minimum}, got {value!r}")
    return items


def conv_padding(padding: Any, kernel: Tuple[int, ...], stride: Tuple[int, ...],
                 dilation: Tuple[int, ...], op: str) -> Tuple[Tuple[int, int], ...]:
    """(before, after) zero padding per spatial dim; "same" puts the odd one after, as torch."""
    if isinstance(padding, str):
        if padding not in PADDING_STRINGS:
            raise ValueError(f"{op}: padding must be an int, a tuple or one of "
                             f"{PADDING_STRINGS}, got {padding!r}")
        if padding == "valid":
            return tuple((0, 0) for _ in kernel)
        if any(s != 1 for s in stride):
            raise ValueError(f"{op}: padding='same' is not supported for strided convolutions "
                             f"(stride={stride})")
        totals = [d * (k - 1) for k, d in zip(kernel, dilation)]
        return tuple((t // 2, t - t // 2) for t in totals)
    return tuple((p, p) for p in expand_param(padding, len(kernel), "padding", op, 0))


# Columns are built for a span of samples at a time, each span's at most this size: glibc
# serves blocks up to 32 MiB from its heap (see backends.allocator) and maps larger ones
# afresh, page faults and all, on every call; smaller spans also stay nearer the cache.
SPAN_BYTES = 16 * 1024 * 1024


def sample_spans(n: int, bytes_per_sample: int) -> list:
    """[(start, stop)] covering 0..n, each span's columns within ``SPAN_BYTES``."""
    per_span = max(1, SPAN_BYTES // max(1, bytes_per_sample))
    return [(start, min(start + per_span, n)) for start in range(0, n, per_span)]


def _check(op: str, xd: Any, wd: Any, bd: Any, groups: int, spatial: int) -> None:
    if xd.ndim != spatial + 2:
        raise ValueError(f"{op}: expected a {spatial + 2}-D input (batch, channels, spatial...) "
                         f"or {spatial + 1}-D unbatched, got shape {tuple(xd.shape)}")
    if wd.ndim != spatial + 2:
        raise ValueError(f"{op}: weight must be {spatial + 2}-D (out_channels, in_channels / "
                         f"groups, kernel...), got shape {tuple(wd.shape)}")
    if not isinstance(groups, int) or groups < 1 or wd.shape[0] % groups:
        raise ValueError(f"{op}: groups={groups!r} must be a positive int dividing "
                         f"out_channels={wd.shape[0]}")
    if xd.shape[1] != wd.shape[1] * groups:
        raise ValueError(f"{op}: input shape {tuple(xd.shape)} has {xd.shape[1]} channels but "
                         f"weight {tuple(wd.shape)} with groups={groups} expects "
                         f"{wd.shape[1] * groups}")
    if xd.dtype != wd.dtype or (bd is not None and bd.dtype != xd.dtype):
        raise TypeError(f"{op}: input dtype {xd.dtype}, weight dtype {wd.dtype}"
                        f"{'' if bd is None else f', bias dtype {bd.dtype}'} must be the same")
    if bd is not None and tuple(bd.shape) != (wd.shape[0],):
        raise ValueError(f"{op}: bias shape {tuple(bd.shape)} must be ({wd.shape[0]},)")


def convolution(x: Tensor, weight: Tensor, bias: Optional[Tensor], stride: IntOrPair,
                padding: Any, dilation: IntOrPair, groups: int, spatial: int, op: str) -> Tensor:
    """torch's ``conv1d`` (``spatial=1``) / ``conv2d`` (``spatial=2``); unbatched input too."""
    x, weight, bias = autocast_inputs(op, x, weight, bias)
    xd, wd = x.array, weight.array
    bd = None if bias is None else bias.array
    unbatched = xd.ndim == spatial + 1
    if unbatched:
        xd = xd[None]
    _check(op, xd, wd, bd, groups, spatial)
    kernel = tuple(wd.shape[2:])
    stride_t = expand_param(stride, spatial, "stride", op, 1)
    dilation_t = expand_param(dilation, spatial, "dilation", op, 1)
    pads = conv_padding(padding, kernel, stride_t, dilation_t, op)
    if spatial == 1:  # a 1-D convolution is a 2-D one over a height of 1
        x4, w4 = xd[:, :, None, :], wd[:, :, None, :]
        kernel, stride_t, dilation_t, pads = ((1,) + kernel, (1,) + stride_t,
                                              (1,) + dilation_t, ((0, 0),) + pads)
    else:
        x4, w4 = xd, wd
    xp = xp_of(x4)
    n, channels, height, width = x4.shape
    padded_hw = (height + sum(pads[0]), width + sum(pads[1]))
    out_hw = tuple((size - d * (k - 1) - 1) // s + 1 for size, k, s, d
                   in zip(padded_hw, kernel, stride_t, dilation_t))
    if min(out_hw) < 1:
        raise ValueError(f"{op}: input shape {tuple(xd.shape)} with padding {padding!r} is "
                         f"smaller than the dilated kernel {tuple(wd.shape[2:])} (dilation "
                         f"{dilation!r})")
    out_channels, group_in = w4.shape[0], w4.shape[1]
    need_x, need_w = x.requires_grad, weight.requires_grad
    need_b = bias is not None and bias.requires_grad
    parents = (x, weight) if bias is None else (x, weight, bias)
    geom = conv_cpu.Geometry(n, channels, height, width, out_channels, groups, kernel,
                             stride_t, dilation_t, pads, out_hw)
    wants_grad = (need_x or need_w or need_b) and GRAD_MODE.enabled
    # a first layer (no input gradient) keeps its few column rows for the weight gradient
    # (conv_kept_columns, or the general columns below): rebuilding them per span costs more
    if isinstance(x4, np.ndarray) and conv_cpu.supports(geom) and (need_x or not wants_grad):
        out = conv_cpu.forward(x4, w4, geom)
        if bd is not None:
            out += bd.reshape(1, -1, 1, 1)
        final = out.reshape((n, out_channels) + out_hw[spatial == 1:])
        final = final[0] if unbatched else final
        if not wants_grad:
            return _constant(final)
        saved = (saved_entry(x), saved_entry(weight))  # torch saves both, whatever needs grad

        def cpu_backward(grad: Any) -> tuple:
            check_saved("ConvolutionBackward", saved)
            g4 = grad.reshape((n, out_channels) + out_hw)
            gx, gw = conv_cpu.backward(g4, x4, w4, geom, need_x, need_w)
            grads = (None if gx is None else gx.reshape(x.array.shape),
                     None if gw is None else gw.reshape(wd.shape))
            if bias is None:
                return grads
            return grads + ((g4.sum(axis=(0, 2, 3)) if need_b else None),)

        return _node(final, parents, cpu_backward)
    if conv_kept_columns.applies(x4, geom, need_x, wants_grad):
        return _kept_columns(x, weight, bias, x4, w4, bd, geom, need_w, need_b,
                             result_shape=(out_channels,) + out_hw[spatial == 1:],
                             unbatched=unbatched)
    group_out = out_channels // groups
    positions = out_hw[0] * out_hw[1]
    group_k = group_in * kernel[0] * kernel[1]
    weights = [w4[g * group_out:(g + 1) * group_out].reshape(group_out, group_k)
               for g in range(groups)]
    spans = sample_spans(n, groups * group_k * positions * x4.dtype.itemsize)
    out = xp.empty((n, out_channels, positions), dtype=x4.dtype)
    columns = []  # per span of samples: (samples, C*kh*kw, P)
    for start, stop in spans:
        cols = im2col(xp, x4[start:stop], kernel, stride_t, dilation_t, pads, out_hw)
        for g in range(groups):  # one product per sample, already in (N, C_out, P) order
            out[start:stop, g * group_out:(g + 1) * group_out] = \
                weights[g] @ cols[:, g * group_k:(g + 1) * group_k]
        columns.append(cols)
    if bd is not None:
        out += bd.reshape(1, -1, 1)
    result_shape = (out_channels,) + out_hw[spatial == 1:]
    final = out.reshape((n,) + result_shape)
    if unbatched:
        final = final[0]
    if not ((need_x or need_w or need_b) and GRAD_MODE.enabled):
        return _constant(final)
    if not need_w:
        columns = []  # only the weight gradient reads the columns again
    saved = (saved_entry(x), saved_entry(weight))

    def backward(grad: Any) -> tuple:
        check_saved("ConvolutionBackward", saved)
        g3 = grad.reshape(n, out_channels, positions)
        gx = gw = None
        if need_w:
            gw = xp.zeros((out_channels, group_k), dtype=g3.dtype)
        if need_x:
            gx = xp.empty((n, channels, height, width), dtype=g3.dtype)
        for span, (start, stop) in enumerate(spans):
            gs = g3[start:stop]
            for g in range(groups):
                rows, ks = slice(g * group_out, (g + 1) * group_out), \
                    slice(g * group_k, (g + 1) * group_k)
                if need_w:  # the sum over samples of g_n @ cols_n.T
                    gw[rows] += (gs[:, rows] @ columns[span][:, ks].transpose(0, 2, 1)).sum(0)
                if need_x:
                    gcols = weights[g].T @ gs[:, rows]
                    gx[start:stop, g * group_in:(g + 1) * group_in] = col2im(
                        xp, gcols, (stop - start, group_in, height, width), kernel, stride_t,
                        dilation_t, pads, out_hw)
        if need_w:
            gw = gw.reshape(wd.shape)
        if need_x:
            gx = gx.reshape(x.array.shape)
        if bias is None:
            return gx, gw
        return gx, gw, (g3.sum(axis=(0, 2)) if need_b else None)

    return _node(final, parents, backward)


def _kept_columns(x: Tensor, weight: Tensor, bias: Optional[Tensor], x4: Any, w4: Any,
                  bd: Any, geom: conv_cpu.Geometry, need_w: bool, need_b: bool,
                  result_shape: Tuple[int, ...], unbatched: bool) -> Tensor:
    """A convolution whose input needs no gradient, on NumPy (``conv_kept_columns``)."""
    out, columns = conv_kept_columns.forward(x4, w4, bd, geom)
    w_shape = tuple(weight.array.shape)
    final = out.reshape((geom.n,) + result_shape)
    final = final[0] if unbatched else final
    if not need_w:
        columns = None  # only the weight gradient reads them
    saved = (saved_entry(x), saved_entry(weight))  # torch saves both, whatever needs grad

    def backward(grad: Any) -> tuple:
        check_saved("ConvolutionBackward", saved)
        g4 = grad.reshape((geom.n, geom.out_channels) + geom.out_hw)
        gw, gb = conv_kept_columns.backward(g4, columns, w_shape, need_w, need_b)
        return (None, gw) if bias is None else (None, gw, gb)

    parents = (x, weight) if bias is None else (x, weight, bias)
    return _node(final, parents, backward)


def _tensor(value: Any) -> Any:
    return value if value is None or isinstance(value, Tensor) else Tensor(value)


def conv1d(input: Any, weight: Any, bias: Any = None, stride: IntOrPair = 1, padding: Any = 0,
           dilation: IntOrPair = 1, groups: int = 1) -> Tensor:
    """torch's ``F.conv1d`` over (N, C, L) or (C, L) inputs."""
    return convolution(_tensor(input), _tensor(weight), _tensor(bias), stride, padding,
                       dilation, groups, 1, "conv1d")


def conv2d(input: Any, weight: Any, bias: Any = None, stride: IntOrPair = 1, padding: Any = 0,
           dilation: IntOrPair = 1, groups: int = 1) -> Tensor:
    """torch's ``F.conv2d`` over (N, C, H, W) or (C, H, W) inputs."""
    return convolution(_tensor(input), _tensor(weight), _tensor(bias), stride, padding,
                       dilation, groups, 2, "conv2d")
