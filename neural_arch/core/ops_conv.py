"""Convolution over 1 or 2 spatial dimensions (``conv1d``, ``conv2d``) as im2col + matmul.

The forward views the zero-padded input as sliding windows (``as_strided``, no copy), copies
each group's windows once into one (C/groups * kernel, positions) matrix per sample and
multiplies the group's weight by them: a batched matmul, whose output is already in NCHW order
(and far faster on BLAS than one tall, skinny product). The backward reuses those matrices for
the weight gradient and adds the windows' gradients back into the input (col2im) with one strided-slice addition per kernel
offset, which is much faster than a scatter (``add.at``) over every element.
A 1-D convolution is the 2-D one with a height of 1.
"""
from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple, Union

from ..backends import xp_of
from .autocast_state import autocast_inputs
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node

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


def sliding_windows(xp: Any, padded: Any, out_size: Tuple[int, int], kernel: Tuple[int, int],
                    stride: Tuple[int, int], dilation: Tuple[int, int]) -> Any:
    """View (N, C, Ho, Wo, kh, kw) of the windows of a (N, C, H, W) array (no copy)."""
    sn, sc, sh, sw = padded.strides
    shape = padded.shape[:2] + tuple(out_size) + tuple(kernel)
    strides = (sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1])
    return xp.lib.stride_tricks.as_strided(padded, shape=shape, strides=strides,
                                           writeable=False)


def add_windows(target: Any, window_grads: Any, stride: Tuple[int, int],
                dilation: Tuple[int, int]) -> None:
    """col2im: add (N, C, Ho, Wo, kh, kw) window gradients into the (N, C, H, W) ``target``."""
    ho, wo, kh, kw = window_grads.shape[2:]
    for i in range(kh):
        top = i * dilation[0]
        for j in range(kw):
            left = j * dilation[1]
            target[:, :, top:top + stride[0] * (ho - 1) + 1:stride[0],
                   left:left + stride[1] * (wo - 1) + 1:stride[1]] += window_grads[..., i, j]


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
    xd, wd = x.data, weight.data
    bd = None if bias is None else bias.data
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
    padded = x4
    if any(p for pair in pads for p in pair):
        padded = xp.pad(x4, ((0, 0), (0, 0)) + pads)
    windows = sliding_windows(xp, padded, out_hw, kernel, stride_t, dilation_t)
    out_channels, group_in = w4.shape[0], w4.shape[1]
    group_out = out_channels // groups
    positions = out_hw[0] * out_hw[1]
    out = xp.empty((n, out_channels, positions), dtype=x4.dtype)
    columns, weights = [], []
    for g in range(groups):
        # (N, Cg, kh, kw, Ho, Wo) in memory order: one copy, then per sample a (K, Ho*Wo)
        cols = windows[:, g * group_in:(g + 1) * group_in].transpose(0, 1, 4, 5, 2, 3)
        cols = xp.ascontiguousarray(cols).reshape(n, -1, positions)
        w2 = w4[g * group_out:(g + 1) * group_out].reshape(group_out, -1)
        out[:, g * group_out:(g + 1) * group_out] = w2 @ cols
        columns.append(cols)
        weights.append(w2)
    out = out.reshape((n, out_channels) + out_hw)
    if bd is not None:
        out += bd.reshape(1, -1, 1, 1)
    result_shape = (out_channels,) + out_hw[spatial == 1:]
    final = out.reshape((n,) + result_shape)
    if unbatched:
        final = final[0]
    parents = (x, weight) if bias is None else (x, weight, bias)
    need_x, need_w = x.requires_grad, weight.requires_grad
    need_b = bias is not None and bias.requires_grad
    if not ((need_x or need_w or need_b) and GRAD_MODE.enabled):
        return _constant(final)

    def backward(grad: Any) -> tuple:
        g4 = grad.reshape((n, out_channels) + out_hw)
        gx = gw = None
        if need_x:
            gpad = xp.zeros((n, channels) + padded_hw, dtype=g4.dtype)
        if need_w:
            gw = xp.empty(w4.shape, dtype=g4.dtype)
        g3 = g4.reshape(n, out_channels, positions)
        for g in range(groups):
            gg = g3[:, g * group_out:(g + 1) * group_out]
            if need_w:
                gw[g * group_out:(g + 1) * group_out] = (
                    gg @ columns[g].transpose(0, 2, 1)).sum(axis=0).reshape(
                        (group_out,) + w4.shape[1:])
            if need_x:
                gcols = (weights[g].T @ gg).reshape((n, group_in) + kernel + out_hw)
                add_windows(gpad[:, g * group_in:(g + 1) * group_in],
                            gcols.transpose(0, 1, 4, 5, 2, 3), stride_t, dilation_t)
        if need_x:
            gx = gpad[:, :, pads[0][0]:pads[0][0] + height, pads[1][0]:pads[1][0] + width]
            gx = gx.reshape(x.data.shape)
        if need_w:
            gw = gw.reshape(wd.shape)
        if bias is None:
            return gx, gw
        return gx, gw, (g4.sum(axis=(0, 2, 3)) if need_b else None)

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
