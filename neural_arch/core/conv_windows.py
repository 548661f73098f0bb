"""Sliding windows of (N, C, H, W) arrays, for convolution and pooling, on NumPy or CuPy.

``sliding_windows`` views the windows without a copy; ``add_windows`` adds window gradients
back (one strided-slice addition per kernel offset, far faster than a scatter). ``im2col`` and
``col2im`` are the convolution's column matrix (N, C * kh * kw, Ho * Wo) and its adjoint.
Every call here takes its array module ``xp`` from the caller and uses only what NumPy and
CuPy share (CuPy's ``as_strided``, for one, has no ``writeable``).
"""
from __future__ import annotations

from typing import Any, Tuple

Pair = Tuple[int, int]


def sliding_windows(xp: Any, padded: Any, out_size: Pair, kernel: Pair, stride: Pair,
                    dilation: Pair) -> Any:
    """View (N, C, Ho, Wo, kh, kw) of the windows of a (N, C, H, W) array (no copy; never
    written through, since the windows overlap)."""
    sn, sc, sh, sw = padded.strides
    shape = padded.shape[:2] + tuple(out_size) + tuple(kernel)
    strides = (sn, sc, sh * stride[0], sw * stride[1], sh * dilation[0], sw * dilation[1])
    return xp.lib.stride_tricks.as_strided(padded, shape, strides)


def add_windows(target: Any, window_grads: Any, stride: Pair, dilation: Pair) -> None:
    """col2im: add (N, C, Ho, Wo, kh, kw) window gradients into the (N, C, H, W) ``target``."""
    ho, wo, kh, kw = window_grads.shape[2:]
    for i in range(kh):
        top = i * dilation[0]
        for j in range(kw):
            left = j * dilation[1]
            target[:, :, top:top + stride[0] * (ho - 1) + 1:stride[0],
                   left:left + stride[1] * (wo - 1) + 1:stride[1]] += window_grads[..., i, j]


def im2col(xp: Any, x4: Any, kernel: Pair, stride: Pair, dilation: Pair,
           pads: Tuple[Pair, Pair], out_hw: Pair) -> Any:
    """The (N, C * kh * kw, Ho * Wo) column matrix of (N, C, H, W) ``x4``: row
    ``(c * kh + i) * kw + j`` holds input channel c at kernel offset (i, j) for every output
    position; zero where a window reaches into the (before, after) ``pads``."""
    n = x4.shape[0]
    positions = out_hw[0] * out_hw[1]
    padded = x4
    if any(p for pair in pads for p in pair):
        padded = xp.pad(x4, ((0, 0), (0, 0)) + tuple(pads))
    windows = sliding_windows(xp, padded, out_hw, kernel, stride, dilation)
    # (N, C, kh, kw, Ho, Wo) in memory order: one copy
    cols = xp.ascontiguousarray(windows.transpose(0, 1, 4, 5, 2, 3))
    return cols.reshape(n, -1, positions)


def col2im(xp: Any, cols: Any, x_shape: Tuple[int, ...], kernel: Pair, stride: Pair,
           dilation: Pair, pads: Tuple[Pair, Pair], out_hw: Pair) -> Any:
    """The (N, C, H, W) gradient of ``im2col``'s input from its columns' gradient."""
    n, channels, height, width = x_shape
    padded_hw = (height + sum(pads[0]), width + sum(pads[1]))
    gpad = xp.zeros((n, channels) + padded_hw, dtype=cols.dtype)
    windows = cols.reshape((n, channels) + tuple(kernel) + tuple(out_hw))
    add_windows(gpad, windows.transpose(0, 1, 4, 5, 2, 3), stride, dilation)
    return gpad[:, :, pads[0][0]:pads[0][0] + height, pads[1][0]:pads[1][0] + width]
