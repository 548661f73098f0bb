"""Stride-1 convolution on the CPU with "wide" columns (see ``conv_cpu``).

A span of B samples is copied into a zero-bordered (B, C, Hp, Wp) buffer. Output position
(r, q) of a sample, for q running over the whole padded width Wp (not only the Wo valid
columns), reads padded[c, r + i*dh, q + j*dw] at tap (i, j): for fixed (c, i, j) that is one
contiguous run of Ho * Wp values starting at (i*dh) * Wp + j*dw. The columns are therefore a
strided view of the buffer and one copy of long runs makes them; positions q >= Wo read into
the next row (or, at a channel's end, the next channel or a zero tail) and are dropped from
the product. The gradient buffers use the same layout.
"""
from __future__ import annotations

from typing import Any, List, Optional, Tuple

import numpy as np

from .conv_cpu import (Geometry, add_product_t, flipped_matrices, group_products, spans,
                       weight_matrices)


class _Columns:
    """Wide columns of the first samples of a flat zero-bordered buffer of up to ``most``
    (channels, *image_hw) images; the strided view is made once per call, not per span."""

    def __init__(self, buffer: Any, most: int, channels: int, image_hw: Tuple[int, int],
                 kernel: Tuple[int, int], dilation: Tuple[int, int]) -> None:
        hp, wp = image_hw
        kh, kw = kernel
        self.positions = (hp - dilation[0] * (kh - 1)) * wp
        self.rows = channels * kh * kw
        item = buffer.itemsize
        # only read, never written through (the runs overlap); no writeable=, as CuPy's has
        # none (a test holds every window view to CuPy's signature)
        self.view = np.lib.stride_tricks.as_strided(
            buffer, (channels, kh, kw, most, self.positions),
            (hp * wp * item, dilation[0] * wp * item, dilation[1] * item,
             channels * hp * wp * item, item))
        self.cols = np.empty(self.rows * most * self.positions, buffer.dtype)

    def __call__(self, samples: int) -> Any:
        """The (channels * kh * kw, samples * positions) columns of the first samples."""
        view = self.view[:, :, :, :samples]
        out = self.cols[:self.rows * samples * self.positions]
        np.copyto(out.reshape(view.shape), view)
        return out.reshape(self.rows, -1)


def _zeroed(size: int, tail: int, dtype: Any) -> Any:
    """A flat zero buffer with ``tail`` spare zeros that the last positions' runs reach."""
    return np.zeros(size + tail, dtype)


def forward(x4: Any, w4: Any, geom: Geometry) -> Any:
    n, channels, height, width = x4.shape
    hp, wp = geom.padded_hw
    (top, _), (left, _) = geom.pads
    ho, wo = geom.out_hw
    rows, positions = channels * geom.taps, ho * wp
    plan = spans(n, rows * positions * x4.dtype.itemsize)
    most = plan[0][1] - plan[0][0]
    padded = _zeroed(most * channels * hp * wp, geom.dilation[1] * (geom.kernel[1] - 1),
                     x4.dtype)
    columns = _Columns(padded, most, channels, (hp, wp), geom.kernel, geom.dilation)
    wide = np.empty(geom.out_channels * most * positions, x4.dtype)
    out = np.empty((n, geom.out_channels, ho, wo), x4.dtype)
    weights = weight_matrices(w4, geom.groups)
    for start, stop in plan:
        m = stop - start
        padded[:m * channels * hp * wp].reshape(m, channels, hp, wp)[
            :, :, top:top + height, left:left + width] = x4[start:stop]
        c2 = columns(m)
        o2 = wide[:geom.out_channels * m * positions].reshape(geom.out_channels, -1)
        group_products(weights, c2, rows // geom.groups, o2)
        out[start:stop] = o2.reshape(geom.out_channels, m, ho, wp)[..., :wo].transpose(
            1, 0, 2, 3)
    return out


def backward(g4: Any, x4: Any, w4: Any, geom: Geometry, need_x: bool,
             need_w: bool) -> Tuple[Optional[Any], Optional[Any]]:
    if not need_x:
        raise ValueError("conv_wide.backward: the input gradient is computed with the weight "
                         "gradient; a convolution whose input needs none takes the stored "
                         f"columns of ops_conv (geometry {geom})")
    return _through_output_columns(g4, x4, w4, geom, need_w)


def _through_output_columns(g4: Any, x4: Any, w4: Any, geom: Geometry,
                            need_w: bool) -> Tuple[Any, Optional[Any]]:
    """The input gradient as the stride-1 convolution of the output gradient, padded by the
    dilated kernel's reach less the forward padding, with the flipped transposed weights;
    the weight gradient (flipped) as those columns times the input laid out the same way."""
    n, channels, height, width = x4.shape
    kh, kw = geom.kernel
    dh, dw = geom.dilation
    (top, _), (left, _) = geom.pads
    top, left = dh * (kh - 1) - top, dw * (kw - 1) - left
    gh, gw = height + dh * (kh - 1), width + dw * (kw - 1)
    ho, wo = geom.out_hw
    cout, groups = geom.out_channels, geom.groups
    rows, positions = cout * geom.taps, height * gw
    plan = spans(n, rows * positions * g4.dtype.itemsize)
    most = plan[0][1] - plan[0][0]
    padded = _zeroed(most * cout * gh * gw, dw * (kw - 1), g4.dtype)
    columns = _Columns(padded, most, cout, (gh, gw), geom.kernel, geom.dilation)
    wide = np.empty(channels * most * positions, g4.dtype)
    gx = np.empty(x4.shape, g4.dtype)
    flips = flipped_matrices(w4, groups)
    inputs = np.empty(channels * most * positions, g4.dtype) if need_w else None
    sums: List[Any] = [np.zeros((rows // groups, channels // groups), g4.dtype)
                       for _ in range(groups)]
    for start, stop in plan:
        m = stop - start
        padded[:m * cout * gh * gw].reshape(m, cout, gh, gw)[
            :, :, top:top + ho, left:left + wo] = g4[start:stop]
        c2 = columns(m)
        o2 = wide[:channels * m * positions].reshape(channels, -1)
        group_products(flips, c2, rows // groups, o2)
        gx[start:stop] = o2.reshape(channels, m, height, gw)[..., :width].transpose(1, 0, 2, 3)
        if need_w:  # x laid out like the columns' positions: zero past the image's width
            x_wide = inputs[:channels * m * positions].reshape(channels, m, height, gw)
            x_wide[..., :width] = x4[start:stop].transpose(1, 0, 2, 3)
            x_wide[..., width:] = 0
            x2 = x_wide.reshape(channels, -1)
            per_in, per_rows = channels // groups, rows // groups
            for g in range(groups):
                add_product_t(sums[g], c2[g * per_rows:(g + 1) * per_rows],
                              x2[g * per_in:(g + 1) * per_in])
    if not need_w:
        return gx, None
    # sums[g][(o, kh-1-i, kw-1-j), c] is the gradient of weight (o, c, i, j)
    gw4 = [s.reshape(-1, kh, kw, channels // groups)[:, ::-1, ::-1].transpose(0, 3, 1, 2)
           for s in sums]
    return gx, np.ascontiguousarray(np.concatenate(gw4) if groups > 1 else gw4[0])
