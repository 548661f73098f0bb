"""col2im for the CPU convolution's backward as a Numba kernel (``core.conv_strided``).

The NumPy form zeroes a padded buffer for a span of samples, adds the columns' gradient into
it with one strided slice addition per kernel tap (kh * kw passes over the buffer) and copies
the interior out into the input gradient. Here one pass per image plane does it all: a plane
of the input gradient is zeroed and receives the rows of every tap while it sits in L1, and
the taps' rows that fall into the padding are skipped instead of added and thrown away.
Importing this module imports Numba; ``available()`` is False without it or with
``NEURAL_ARCH_NUMBA=0``.
"""
from __future__ import annotations

from typing import Tuple

import numpy as np

from .numba_backend import compiled

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
