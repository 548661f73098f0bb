"""Convolution on the CPU (NumPy) as im2col + one GEMM per span of samples, spans sized to L2.

Building the whole batch's column matrix first and multiplying it after costs a trip through
memory for every byte of it (the columns of a 16-channel 3x3 layer over 64 32x32 images are
38 MB): here a few samples' columns are built and consumed while they are still in cache,
and nothing is kept for the backward, which rebuilds what it needs the same way.

A span's columns are a (C * kh * kw, B * positions) matrix, so that each group's product is a
single GEMM. Stride-1 convolutions (``conv_wide``) use "wide" columns: the positions of each
output row run on over the padding to the padded width, so that every column row is one
contiguous run of the padded input (a copy of long runs instead of kh * kw * C * Ho short
ones); the extra positions are computed and dropped. Their input gradient is a convolution of
the padded output gradient with the flipped, transposed weights (columns + GEMM again, no
scatter-adds), and the weight gradient comes from those same columns. Strided convolutions
(``conv_strided``) build ordinary columns and add the columns' gradient back per span. Both
backwards expect the input to need a gradient (``ops_conv`` keeps a first layer's columns).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

import numpy as np

Pair = Tuple[int, int]

# The columns of one span of samples stay within this many bytes, so that they are still in
# cache when the GEMM reads them (a resnet8 step was fastest at 256-512 KiB; 1 MiB and more
# were 4-10% slower on a 2 MiB-L2 core). A sample whose columns are larger is a span alone.
SPAN_BYTES = 512 * 1024


@dataclass(frozen=True)
class Geometry:
    """A 2-D convolution's shapes: input (n, channels, height, width), weight (out_channels,
    channels // groups, kh, kw), output (n, out_channels, out_h, out_w)."""

    n: int
    channels: int
    height: int
    width: int
    out_channels: int
    groups: int
    kernel: Pair
    stride: Pair
    dilation: Pair
    pads: Tuple[Pair, Pair]
    out_hw: Pair

    @property
    def padded_hw(self) -> Pair:
        return (self.height + sum(self.pads[0]), self.width + sum(self.pads[1]))

    @property
    def is_padded(self) -> bool:
        """Whether any side is padded: the windows are then those of a zero-bordered copy."""
        return any(self.pads[0] + self.pads[1])

    @property
    def taps(self) -> int:
        return self.kernel[0] * self.kernel[1]

    @property
    def group_in(self) -> int:
        return self.channels // self.groups

    @property
    def group_out(self) -> int:
        return self.out_channels // self.groups


def interior(padded: Any, geom: Geometry) -> Any:
    """The part of a zero-bordered buffer (..., padded height, padded width) that is the image:
    where the input is copied in, and where its gradient is read out."""
    (top, _), (left, _) = geom.pads
    return padded[..., top:top + geom.height, left:left + geom.width]


def spans(n: int, bytes_per_sample: int) -> List[Tuple[int, int]]:
    """[(start, stop)] covering 0..n, each span's columns within ``SPAN_BYTES``."""
    per_span = max(1, SPAN_BYTES // max(1, bytes_per_sample))
    return [(start, min(start + per_span, n)) for start in range(0, n, per_span)]


def group_products(weights: List[Any], cols: Any, rows_per_group: int, out: Any) -> None:
    """``out[group rows] = weights[g] @ cols[group rows]`` for each group, into ``out``."""
    step = weights[0].shape[0]
    for g, w in enumerate(weights):
        np.matmul(w, cols[g * rows_per_group:(g + 1) * rows_per_group],
                  out=out[g * step:(g + 1) * step])


def add_product_t(total: Any, a: Any, b: Any) -> None:
    """``total += a @ b.T`` for the weight gradient's long inner dimension; OpenBLAS is faster
    (up to 1.5x at these shapes) when the operand with more rows comes first, so the
    product is taken as ``(b @ a.T).T`` when ``b`` has more."""
    total += a @ b.T if a.shape[0] >= b.shape[0] else (b @ a.T).T


def weight_matrices(w4: Any, groups: int) -> List[Any]:
    """Each group's (group_out, group_in * kh * kw) weight matrix."""
    group_out = w4.shape[0] // groups
    return [w4[g * group_out:(g + 1) * group_out].reshape(group_out, -1) for g in range(groups)]


def flipped_matrices(w4: Any, groups: int) -> List[Any]:
    """Each group's (group_in, group_out * kh * kw) matrix of the weights flipped in space
    and transposed: the kernel of the input gradient of a stride-1 convolution."""
    group_out = w4.shape[0] // groups
    flipped = w4[:, :, ::-1, ::-1]
    return [np.ascontiguousarray(flipped[g * group_out:(g + 1) * group_out]
                                 .transpose(1, 0, 2, 3)).reshape(w4.shape[1], -1)
            for g in range(groups)]


_kernels: Any = None  # backends.conv_kernels when Numba runs, else False; on first use


def numba_kernels(dtype: Any) -> Any:
    """``backends.conv_kernels`` (the Numba im2col and col2im loops of ``conv_kept_columns``
    and ``conv_strided``) when Numba runs and they take arrays of ``dtype``, else None."""
    global _kernels
    if _kernels is None:
        from ..backends import conv_kernels
        _kernels = conv_kernels if conv_kernels.available() else False
    return _kernels if _kernels and dtype in _kernels.DTYPES else None


def supports(geom: Geometry) -> bool:
    """Whether ``conv_wide`` / ``conv_strided`` take this convolution: stride 1 with padding
    no wider than the dilated kernel (its gradient pads the output gradient by the rest), or
    any stride (then the columns' gradient is added back)."""
    if geom.stride != (1, 1):
        return True
    reach = (geom.dilation[0] * (geom.kernel[0] - 1), geom.dilation[1] * (geom.kernel[1] - 1))
    return all(p <= r for pair, r in zip(geom.pads, reach) for p in pair)


def forward(x4: Any, w4: Any, geom: Geometry) -> Any:
    """The (n, out_channels, out_h, out_w) output of the convolution (no bias)."""
    from . import conv_strided, conv_wide
    module = conv_wide if geom.stride == (1, 1) else conv_strided
    return module.forward(x4, w4, geom)


def backward(g4: Any, x4: Any, w4: Any, geom: Geometry, need_x: bool,
             need_w: bool) -> Tuple[Optional[Any], Optional[Any]]:
    """(input gradient or None, weight gradient or None) from the output gradient ``g4``."""
    from . import conv_strided, conv_wide
    module = conv_wide if geom.stride == (1, 1) else conv_strided
    return module.backward(np.ascontiguousarray(g4), x4, w4, geom, need_x, need_w)
