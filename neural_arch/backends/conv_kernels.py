"""col2im for the CPU convolution's backward as a Numba kernel (``core.conv_strided``), and
im2col for a first layer's kept columns (``core.conv_kept_columns``).

The NumPy form zeroes a padded buffer for a span of samples, adds the columns' gradient into
it with one strided slice addition per kernel tap (kh * kw passes over the buffer) and copies
the interior out into the input gradient. Here one pass per image plane does it all: a plane
of the input gradient is zeroed and receives the rows of every tap while it sits in L1, and
the taps' rows that fall into the padding are skipped instead of added and thrown away.
The im2col copies each column row in one loop over a zero-bordered copy of the input, at a
unit stride along the width (3 channels, 3x3, batch 64 of 32x32 images: 0.29 ms against
0.53 ms for NumPy's copy of the sliding-windows view; at a width stride of 2 the two were
even, so NumPy's copy does those).
Importing this module imports Numba; ``available()`` is False without it or with
``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .numba_backend import compiled

# the files its cached machine code is built from (``numba_backend``): itself, and the njit
# options of ``numba_backend``
BUILT_FROM = ("conv_kernels", "numba_backend")

DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
Pair = Tuple[int, int]


@compiled
def _add_columns(cols, kernel, stride, dilation, offset, out):  # pragma: no cover - compiled
    # cols: (C * kh * kw, m, Ho, Wo); out: (m, C, H, W); offset: the (top, left) padding
    kh, kw = kernel[0], kernel[1]
    sh, sw = stride[0], stride[1]
    dh, dw = dilation[0], dilation[1]
    top, left = offset[0], offset[1]
    samples, channels, height, width = out.shape
    out_h, out_w = cols.shape[2], cols.shape[3]
    for n in range(samples):
        for c in range(channels):
            plane = out[n, c]
            plane[:, :] = 0
            for i in range(kh):
                for j in range(kw):
                    row = cols[(c * kh + i) * kw + j, n]
                    shift = j * dw - left
                    # the output columns whose input column ow * sw + shift is inside the image
                    first = 0 if shift >= 0 else (-shift + sw - 1) // sw
                    stop = min(out_w, (width - 1 - shift) // sw + 1) if width - 1 >= shift \
                        else 0
                    for oh in range(out_h):
                        h = oh * sh + i * dh - top
                        if h < 0 or h >= height:
                            continue
                        target, source = plane[h], row[oh]
                        for ow in range(first, stop):
                            target[ow * sw + shift] += source[ow]


@compiled
def _fill_columns(source, kernel, row_stride, dilation, cols):  # pragma: no cover - compiled
    # source: (m, C, Hp, Wp), zero-bordered; cols: (m, rows >= C * kh * kw, Ho * Wo); unit
    # stride along the width: each output row's window row is a contiguous run, whose copy
    # through 1-D views indexed from 0 LLVM turns into vector moves (indexing the 4-D source
    # directly, or a branch for other strides in this loop nest, made it 1.6-2.8x slower)
    kh, kw = kernel[0], kernel[1]
    dh, dw = dilation[0], dilation[1]
    samples, channels = source.shape[0], source.shape[1]
    out_h = (source.shape[2] - dh * (kh - 1) - 1) // row_stride + 1
    out_w = source.shape[3] - dw * (kw - 1)
    for n in range(samples):
        for c in range(channels):
            for i in range(kh):
                for j in range(kw):
                    row = cols[n, (c * kh + i) * kw + j]
                    for oh in range(out_h):
                        line = source[n, c, oh * row_stride + i * dh, j * dw:]
                        dst = row[oh * out_w:(oh + 1) * out_w]
                        for ow in range(out_w):
                            dst[ow] = line[ow]


def available() -> bool:
    """True when the kernel runs (Numba installed and not switched off)."""
    return _add_columns is not None


def add_columns(cols: np.ndarray, kernel: Pair, stride: Pair, dilation: Pair, pads: Pair,
                out: np.ndarray) -> None:
    """col2im: ``out`` (samples, C, H, W), C-contiguous, becomes the sum of the (C * kh * kw,
    samples, Ho, Wo) columns' gradient ``cols`` over the windows they came from; ``pads``:
    the (top, left) zero padding of the forward."""
    as_array = lambda pair: np.array(pair, np.int64)  # noqa: E731
    _add_columns(cols, as_array(kernel), as_array(stride), as_array(dilation), as_array(pads),
                 out)


def fill_columns(source: np.ndarray, kernel: Pair, row_stride: int, dilation: Pair,
                 cols: np.ndarray) -> None:
    """im2col at a unit stride along the width: the first C * kh * kw rows of ``cols``
    (samples, rows, Ho * Wo), C-contiguous, become the columns of the zero-bordered ``source``
    (samples, C, Hp, Wp): row ``(c * kh + i) * kw + j`` holds channel c at kernel offset
    (i, j) of every window; ``row_stride`` is the stride along the height."""
    as_array = lambda pair: np.array(pair, np.int64)  # noqa: E731
    _fill_columns(np.ascontiguousarray(source), as_array(kernel), int(row_stride),
                  as_array(dilation), cols)
