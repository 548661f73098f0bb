"""A convolution whose input needs no gradient (a network's first layer) on the CPU: the whole
batch's columns are built once in the forward and kept for the weight gradient.

Such a layer has few input channels (3 for images), so its columns are few rows (27 for a 3x3
kernel) and cheaper kept than rebuilt, and without an input gradient the backward needs
nothing else. With a bias the columns get a row of ones and the weight matrix the bias as its
last column: the batched product (C_out, K + 1) @ (N, K + 1, P) is then the output with its
bias, already in (N, C_out, Ho * Wo) order, and the backward's g_n @ cols_n.T is the weight
gradient with the bias gradient as its last column. That saves the passes over the output
that a separate bias add and bias-gradient sum cost, and the copy of a product into the
output (together a third of a 3->16 layer's step at batch 64 of 32x32 images).

The columns are copied out of a zero-bordered copy of the input: by a Numba loop where Numba
runs and the width stride is 1 (``backends.conv_kernels``), else as one NumPy copy of its
sliding-windows view. Grouped convolutions keep ``ops_conv``'s general whole-batch columns.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from .conv_cpu import Geometry, interior, numba_kernels
from .conv_windows import sliding_windows


def applies(x4: Any, geom: Geometry, need_x: bool, wants_grad: bool) -> bool:
    """Whether this form takes the convolution: NumPy, ungrouped, a gradient wanted for the
    weight or bias only."""
    return isinstance(x4, np.ndarray) and geom.groups == 1 and wants_grad and not need_x


def _fill_columns(x4: Any, geom: Geometry, columns: Any) -> None:
    """The first C * kh * kw rows of ``columns`` (n, rows, Ho * Wo) become the columns of
    ``x4``: row ``(c * kh + i) * kw + j`` holds channel c at kernel offset (i, j) of every
    window."""
    n, channels = x4.shape[:2]
    source = x4
    if geom.is_padded:
        source = np.zeros((n, channels) + geom.padded_hw, x4.dtype)
        interior(source, geom)[...] = x4
    kernels = numba_kernels(x4.dtype)
    if kernels is not None and geom.stride[1] == 1:
        kernels.fill_columns(source, geom.kernel, geom.stride[0], geom.dilation, columns)
        return
    windows = sliding_windows(np, source, geom.out_hw, geom.kernel, geom.stride, geom.dilation)
    np.copyto(columns[:, :channels * geom.taps].reshape((n, channels) + geom.kernel
                                                         + geom.out_hw),
              windows.transpose(0, 1, 4, 5, 2, 3))


def forward(x4: Any, w4: Any, bias: Optional[Any], geom: Geometry) -> Tuple[Any, Any]:
    """(the (n, C_out, Ho, Wo) output with its bias, the columns the backward reads)."""
    rows = geom.channels * geom.taps
    positions = geom.out_hw[0] * geom.out_hw[1]
    columns = np.empty((geom.n, rows + (bias is not None), positions), x4.dtype)
    _fill_columns(x4, geom, columns)
    weights = w4.reshape(geom.out_channels, rows)
    if bias is not None:
        columns[:, rows] = 1
        weights = np.concatenate([weights, bias.reshape(-1, 1)], axis=1)
    out = np.empty((geom.n, geom.out_channels, positions), x4.dtype)
    np.matmul(weights, columns, out=out)
    return out.reshape((geom.n, geom.out_channels) + geom.out_hw), columns


def backward(g4: Any, columns: Optional[Any], w_shape: Tuple[int, ...], need_w: bool,
             need_b: bool) -> Tuple[Optional[Any], Optional[Any]]:
    """(weight gradient or None, bias gradient or None) from the output gradient ``g4``;
    ``columns`` are ``forward``'s (None when the weight needs no gradient)."""
    n, out_channels = g4.shape[:2]
    g3 = g4.reshape(n, out_channels, -1)
    if not need_w:
        return None, (g3.sum(axis=(0, 2)) if need_b else None)
    # (n, C_out, K [+ 1]) products summed over the samples; the ones row gives the bias's
    sums = np.matmul(g3, columns.transpose(0, 2, 1)).sum(axis=0)
    rows = int(np.prod(w_shape[1:]))
    gw = np.ascontiguousarray(sums[:, :rows]).reshape(w_shape)
    if not need_b:
        return gw, None
    return gw, sums[:, rows].copy()  # a layer with a bias has the ones row
