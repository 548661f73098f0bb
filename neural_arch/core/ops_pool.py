"""2-D pooling: ``max_pool2d``, ``avg_pool2d``, ``adaptive_avg_pool2d`` (torch's semantics).

Output sizes follow torch: ``floor`` (or ``ceil`` with ``ceil_mode``) of
``(H + 2p - d(k - 1) - 1) / s + 1``, dropping a last window that would start in the right
padding. Inputs are (N, C, H, W) or unbatched (C, H, W).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Sequence, Tuple, Union

from ..backends import xp_of
from .grad_mode import GRAD_MODE
from .conv_windows import add_windows, sliding_windows
from .ops_conv import expand_param
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry

IntOrPair = Union[int, Sequence[int]]


def pooled_size(size: int, kernel: int, stride: int, pad: int, dilation: int,
                ceil_mode: bool) -> int:
    span = size + 2 * pad - dilation * (kernel - 1) - 1
    out = (-(-span // stride) if ceil_mode else span // stride) + 1
    if ceil_mode and (out - 1) * stride >= size + pad:
        out -= 1  # the last window would start inside the right padding
    return out


def _as_batched(op: str, x: Tensor) -> Tuple[Any, bool]:
    xd = x.array
    if xd.ndim not in (3, 4):
        raise ValueError(f"{op}: expected a (N, C, H, W) or (C, H, W) input, got shape "
                         f"{tuple(xd.shape)}")
    return (xd[None], True) if xd.ndim == 3 else (xd, False)


def _geometry(op: str, x4: Any, kernel_size: IntOrPair, stride: Optional[IntOrPair],
              padding: IntOrPair, dilation: IntOrPair, ceil_mode: bool) -> tuple:
    kernel = expand_param(kernel_size, 2, "kernel_size", op, 1)
    strides = kernel if stride is None or stride == [] or stride == () else \
        expand_param(stride, 2, "stride", op, 1)
    pads = expand_param(padding, 2, "padding", op, 0)
    dil = expand_param(dilation, 2, "dilation", op, 1)
    for p, k, d in zip(pads, kernel, dil):
        if p > (d * (k - 1) + 1) // 2:
            raise ValueError(f"{op}: padding {padding!r} must be at most half the effective "
                             f"kernel size (kernel_size={kernel_size!r}, dilation={dilation!r})")
    out_hw = tuple(pooled_size(size, k, s, p, d, ceil_mode) for size, k, s, p, d
                   in zip(x4.shape[2:], kernel, strides, pads, dil))
    if min(out_hw) < 1:
        raise ValueError(f"{op}: input shape {tuple(x4.shape)} is too small for kernel_size "
                         f"{kernel_size!r}, padding {padding!r}, dilation {dilation!r}")
    # right padding: the declared one, plus what ceil_mode's partial last window reaches
    extra = tuple(max(0, (o - 1) * s + d * (k - 1) + 1 - (size + 2 * p))
                  for o, s, d, k, size, p in zip(out_hw, strides, dil, kernel, x4.shape[2:], pads))
    return kernel, strides, pads, dil, out_hw, extra


def _pad(xp: Any, x4: Any, pads: tuple, extra: tuple, value: float) -> Any:
    if not any(pads) and not any(extra):
        return x4
    widths = ((0, 0), (0, 0), (pads[0], pads[0] + extra[0]), (pads[1], pads[1] + extra[1]))
    return xp.pad(x4, widths, constant_values=value)


def _finish(out: Any, unbatched: bool) -> Any:
    return out[0] if unbatched else out


def max_pool2d(x: Tensor, kernel_size: IntOrPair, stride: Optional[IntOrPair] = None,
               padding: IntOrPair = 0, dilation: IntOrPair = 1, ceil_mode: bool = False,
               return_indices: bool = False) -> Any:
    """Window maxima; the gradient goes to each window's first maximum (as torch). With
    ``return_indices`` also returns the flat ``h * W + w`` input index of each maximum."""
    op = "max_pool2d"
    x4, unbatched = _as_batched(op, x)
    kernel, strides, pads, dil, out_hw, extra = _geometry(op, x4, kernel_size, stride, padding,
                                                          dilation, ceil_mode)
    xp = xp_of(x4)
    padded = _pad(xp, x4, pads, extra, -math.inf)
    windows = sliding_windows(xp, padded, out_hw, kernel, strides, dil)
    flat = windows.reshape(windows.shape[:4] + (-1,))  # copies: the windows overlap
    arg = flat.argmax(axis=-1)  # first maximum; NaN counts as the maximum, as in torch
    out = xp.take_along_axis(flat, arg[..., None], axis=-1)[..., 0]
    result = _finish(out, unbatched)
    indices = None
    if return_indices:
        row, col = arg // kernel[1], arg % kernel[1]
        top = xp.arange(out_hw[0]).reshape(-1, 1) * strides[0] - pads[0]
        left = xp.arange(out_hw[1]).reshape(1, -1) * strides[1] - pads[1]
        indices = _constant(_finish(((top + row * dil[0]) * x4.shape[3]
                                     + left + col * dil[1]).astype(xp.int64), unbatched))
    if not (x.requires_grad and GRAD_MODE.enabled):
        out_tensor = _constant(result)
    else:
        saved = (saved_entry(x),)  # torch saves the input (the maxima are found here already)

        def backward(grad: Any) -> tuple:
            check_saved("MaxPool2DWithIndicesBackward", saved)
            g4 = grad.reshape(out.shape)
            gpad = xp.zeros(padded.shape, dtype=g4.dtype)
            offsets = xp.arange(kernel[0] * kernel[1]).reshape(kernel)
            # (N, C, Ho, Wo, kh, kw) window gradients: g at the argmax offset, 0 elsewhere
            picks = (arg[..., None, None] == offsets) * g4[..., None, None]
            add_windows(gpad, picks, strides, dil)
            gx = gpad[:, :, pads[0]:pads[0] + x4.shape[2], pads[1]:pads[1] + x4.shape[3]]
            return (gx.reshape(x.array.shape),)

        out_tensor = _node(result, (x,), backward)
    return (out_tensor, indices) if return_indices else out_tensor


def _avg_divisors(xp: Any, size: int, out: int, kernel: int, stride: int, pad: int,
                  count_include_pad: bool) -> Any:
    starts = [o * stride - pad for o in range(out)]
    ends = [min(s + kernel, size + pad) for s in starts]
    if count_include_pad:
        counts = [e - s for s, e in zip(starts, ends)]
    else:
        counts = [min(e, size) - max(s, 0) for s, e in zip(starts, ends)]
    return xp.asarray(counts, dtype=xp.float64)


def avg_pool2d(x: Tensor, kernel_size: IntOrPair, stride: Optional[IntOrPair] = None,
               padding: IntOrPair = 0, ceil_mode: bool = False, count_include_pad: bool = True,
               divisor_override: Optional[int] = None) -> Tensor:
    """Window means; the divisor counts the padding (``count_include_pad``) but never the
    part of a ``ceil_mode`` window past the right padding, as torch."""
    op = "avg_pool2d"
    x4, unbatched = _as_batched(op, x)
    kernel, strides, pads, dil, out_hw, extra = _geometry(op, x4, kernel_size, stride, padding,
                                                          1, ceil_mode)
    xp = xp_of(x4)
    if divisor_override is not None:
        if not isinstance(divisor_override, int) or divisor_override <= 0:
            raise ValueError(f"{op}: divisor_override must be a positive int, got "
                             f"{divisor_override!r}")
        scale = xp.full(out_hw, 1.0 / divisor_override)
    else:
        rows, cols = (_avg_divisors(xp, size, o, k, s, p, count_include_pad)
                      for size, o, k, s, p in zip(x4.shape[2:], out_hw, kernel, strides, pads))
        scale = 1.0 / (rows[:, None] * cols[None, :])
    scale = scale.astype(x4.dtype)
    padded = _pad(xp, x4, pads, extra, 0.0)
    windows = sliding_windows(xp, padded, out_hw, kernel, strides, dil)
    out = windows.sum(axis=(4, 5)) * scale
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(_finish(out, unbatched))
    saved = (saved_entry(x),)  # torch's saves the input, though only its shape is read

    def backward(grad: Any) -> tuple:
        check_saved("AvgPool2DBackward", saved)
        g4 = grad.reshape(out.shape) * scale
        gpad = xp.zeros(padded.shape, dtype=g4.dtype)
        spread = xp.broadcast_to(g4[..., None, None], g4.shape + kernel)
        add_windows(gpad, spread, strides, dil)
        gx = gpad[:, :, pads[0]:pads[0] + x4.shape[2], pads[1]:pads[1] + x4.shape[3]]
        return (gx.reshape(x.array.shape),)

    return _node(_finish(out, unbatched), (x,), backward)


def _adaptive_matrix(xp: Any, size: int, out: int, dtype: Any) -> Any:
    """(out, size) averaging matrix: row i averages [floor(i*size/out), ceil((i+1)*size/out))."""
    matrix = xp.zeros((out, size), dtype=dtype)
    for i in range(out):
        start, end = (i * size) // out, -(-((i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


def _even_windows_mean(x: Tensor, x4: Any, sizes: Tuple[int, int], unbatched: bool,
                       xp: Any) -> Tensor:
    """Adaptive windows that tile the input, all kh x kw (global pooling among them): a mean
    over a reshape and a broadcast back, one pass over the input each way, where the matrix
    products cost n * c tiny products each way (two fifths of the training step of a 3->16
    convolution with global pooling at batch 64 of 32x32 images). The gradient
    is ``grad / (kh * kw)``, torch's own expression, so it matches torch's to the bit."""
    n, channels, height, width = x4.shape
    (out_h, out_w), (kh, kw) = sizes, (height // sizes[0], width // sizes[1])
    blocks = (n, channels, out_h, kh, out_w, kw)
    out = x4.reshape(blocks).mean(axis=(3, 5))
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(_finish(out, unbatched))

    def backward(grad: Any) -> tuple:
        spread = grad.reshape(n, channels, out_h, 1, out_w, 1) / (kh * kw)
        return (xp.ascontiguousarray(xp.broadcast_to(spread, blocks)).reshape(x.array.shape),)

    return _node(_finish(out, unbatched), (x,), backward)


def adaptive_avg_pool2d(x: Tensor, output_size: Any) -> Tensor:
    """Means over torch's adaptive windows; a rectangle's mean is a row mean of column means,
    so the op is two small matrix products (and so is its backward), unless the windows tile
    the input evenly (``_even_windows_mean``)."""
    op = "adaptive_avg_pool2d"
    x4, unbatched = _as_batched(op, x)
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else \
        (output_size, output_size)
    if len(sizes) != 2:
        raise ValueError(f"{op}: output_size must be an int or 2 values, got {output_size!r}")
    sizes = tuple(x4.shape[2 + i] if s is None else s for i, s in enumerate(sizes))
    if not all(isinstance(s, int) and s > 0 for s in sizes):
        raise ValueError(f"{op}: output_size must hold positive ints or None, got "
                         f"{output_size!r}")
    if min(x4.shape[2:]) < 1:
        raise ValueError(f"{op}: input shape {tuple(x.array.shape)} has an empty spatial dim")
    xp = xp_of(x4)
    if x4.shape[2] % sizes[0] == 0 and x4.shape[3] % sizes[1] == 0:
        return _even_windows_mean(x, x4, sizes, unbatched, xp)
    rows = _adaptive_matrix(xp, x4.shape[2], sizes[0], x4.dtype)
    cols = _adaptive_matrix(xp, x4.shape[3], sizes[1], x4.dtype)
    out = rows @ (x4 @ cols.T)
    if not (x.requires_grad and GRAD_MODE.enabled):
        return _constant(_finish(out, unbatched))

    def backward(grad: Any) -> tuple:
        g4 = grad.reshape(out.shape)
        return ((rows.T @ g4 @ cols).reshape(x.array.shape),)

    return _node(_finish(out, unbatched), (x,), backward)
