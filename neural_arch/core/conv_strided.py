"""Strided convolution on the CPU: ordinary columns, one span of samples at a time (see
``conv_cpu``). The backward rebuilds a span's columns for the weight gradient and adds the
columns' gradient back into the span's input gradient while both are still in cache: with
Numba in one pass per image plane (``backends.conv_kernels``), else into a zero-bordered
buffer, one strided addition per kernel tap."""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from .conv_cpu import Geometry, add_product_t, group_products, interior, numba_kernels, \
    spans, weight_matrices
from .conv_windows import add_windows, sliding_windows


class _Span:
    """The zero-bordered input buffer and the columns of up to ``most`` samples."""

    def __init__(self, x4: Any, geom: Geometry, most: int) -> None:
        self.x4, self.geom, self.most = x4, geom, most
        self.rows = geom.channels * geom.taps
        self.positions = geom.out_hw[0] * geom.out_hw[1]
        # without padding the windows are those of the input itself (no copy into a buffer)
        self.padded = np.zeros((most, geom.channels) + geom.padded_hw, x4.dtype) \
            if geom.is_padded else None
        source = x4 if self.padded is None else self.padded
        # (C, kh, kw, samples, Ho, Wo): the columns' order, made once per call
        self.windows = sliding_windows(np, source, geom.out_hw, geom.kernel, geom.stride,
                                       geom.dilation).transpose(1, 4, 5, 0, 2, 3)
        self.cols = np.empty(self.rows * most * self.positions, x4.dtype)

    def columns(self, start: int, stop: int) -> Any:
        """The (C * kh * kw, samples * Ho * Wo) columns of samples start..stop."""
        m = stop - start
        if self.padded is None:
            view = self.windows[:, :, :, start:stop]
        else:
            interior(self.padded[:m], self.geom)[...] = self.x4[start:stop]
            view = self.windows[:, :, :, :m]
        c2 = self.cols[:self.rows * m * self.positions]
        np.copyto(c2.reshape(view.shape), view)
        return c2.reshape(self.rows, -1)


def _plan(geom: Geometry, itemsize: int) -> list:
    return spans(geom.n, geom.channels * geom.taps * geom.out_hw[0] * geom.out_hw[1] * itemsize)


def forward(x4: Any, w4: Any, geom: Geometry) -> Any:
    plan = _plan(geom, x4.dtype.itemsize)
    span = _Span(x4, geom, plan[0][1] - plan[0][0])
    cout, (ho, wo) = geom.out_channels, geom.out_hw
    products = np.empty(cout * span.most * span.positions, x4.dtype)
    out = np.empty((geom.n, cout, ho, wo), x4.dtype)
    weights = weight_matrices(w4, geom.groups)
    for start, stop in plan:
        c2 = span.columns(start, stop)
        o2 = products[:cout * c2.shape[1]].reshape(cout, -1)
        group_products(weights, c2, span.rows // geom.groups, o2)
        out[start:stop] = o2.reshape(cout, stop - start, ho, wo).transpose(1, 0, 2, 3)
    return out


def backward(g4: Any, x4: Any, w4: Any, geom: Geometry, need_x: bool,
             need_w: bool) -> Tuple[Optional[Any], Optional[Any]]:
    plan = _plan(geom, x4.dtype.itemsize)
    most = plan[0][1] - plan[0][0]
    span = _Span(x4, geom, most)
    cout, groups, (ho, wo) = geom.out_channels, geom.groups, geom.out_hw
    (top, _), (left, _) = geom.pads
    rows, per_out = span.rows, cout // groups
    per_rows = rows // groups
    grads = np.empty(cout * most * span.positions, g4.dtype)
    weights = weight_matrices(w4, groups)
    sums = [np.zeros((per_out, per_rows), g4.dtype) for _ in range(groups)] if need_w else None
    gx = np.empty(x4.shape, g4.dtype) if need_x else None
    col_grads = np.empty(rows * most * span.positions, g4.dtype) if need_x else None
    kernels = numba_kernels(g4.dtype) if need_x else None
    buffer_size = most * geom.channels * geom.padded_hw[0] * geom.padded_hw[1]
    target = np.zeros(buffer_size, g4.dtype) if need_x and kernels is None else None
    for start, stop in plan:
        m = stop - start
        g2 = grads[:cout * m * span.positions].reshape(cout, -1)
        g2.reshape(cout, m, ho, wo)[...] = g4[start:stop].transpose(1, 0, 2, 3)
        if need_w:
            c2 = span.columns(start, stop)
            for g in range(groups):
                add_product_t(sums[g], g2[g * per_out:(g + 1) * per_out],
                              c2[g * per_rows:(g + 1) * per_rows])
        if need_x:
            gc = col_grads[:rows * m * span.positions].reshape(rows, -1)
            for g in range(groups):
                np.matmul(weights[g].T, g2[g * per_out:(g + 1) * per_out],
                          out=gc[g * per_rows:(g + 1) * per_rows])
            if kernels is not None:
                kernels.add_columns(gc.reshape(rows, m, ho, wo), geom.kernel, geom.stride,
                                    geom.dilation, (top, left), gx[start:stop])
            else:
                _add_through_buffer(gc, target, geom, gx[start:stop])
    gw = None
    if need_w:
        gw = np.concatenate(sums).reshape((cout, geom.channels // groups) + geom.kernel)
    return gx, gw


def _add_through_buffer(gc: Any, target: Any, geom: Geometry, gx_span: Any) -> None:
    """col2im without Numba: ``gx_span`` (m samples) from the columns' gradient ``gc``, added
    tap by tap into the zero-bordered ``target`` buffer, whose interior is then copied out."""
    m, (hp, wp), (ho, wo) = gx_span.shape[0], geom.padded_hw, geom.out_hw
    t4 = target[:m * geom.channels * hp * wp].reshape(m, geom.channels, hp, wp)
    t4[...] = 0
    add_windows(t4, gc.reshape((geom.channels,) + geom.kernel + (m, ho, wo))
                .transpose(3, 0, 4, 5, 1, 2), geom.stride, geom.dilation)
    gx_span[...] = interior(t4, geom)
