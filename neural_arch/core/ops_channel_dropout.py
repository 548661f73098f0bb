"""``dropout2d``: zero whole channels (every spatial position of an (n, c) pair) at once."""
from __future__ import annotations

from typing import Any

from ..backends import xp_of
from .grad_mode import GRAD_MODE
from .random import get_rng
from .tensor import Tensor, _constant, _node


def dropout2d(input: Tensor, p: float = 0.5, training: bool = True, inplace: bool = False,
              rng: Any = None) -> Tensor:
    """Zero each channel of an (N, C, H, W) input (or (N, C, L): channels as 1-D features,
    as torch) with probability ``p``, scaling the kept ones by 1 / (1 - p)."""
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout2d probability must be in [0, 1], got {p}")
    if inplace:
        raise ValueError("dropout2d: inplace=True is not supported (tensors that record a "
                         "graph are never changed in place); use inplace=False")
    xd = input.array
    if xd.ndim not in (3, 4):
        raise ValueError(f"dropout2d: expected a (N, C, H, W) or (N, C, L) input, got shape "
                         f"{tuple(xd.shape)}")
    if not training or p == 0.0:
        return input
    xp = xp_of(xd)
    mask_shape = xd.shape[:2] + (1,) * (xd.ndim - 2)
    if p == 1.0:
        mask = xp.zeros(mask_shape, dtype=xd.dtype)
    else:
        generator = rng if rng is not None else get_rng()
        draws = xp.asarray(generator.random(mask_shape))
        mask = (draws >= p).astype(xd.dtype) * xd.dtype.type(1.0 / (1.0 - p))
    out = xd * mask
    if input.requires_grad and GRAD_MODE.enabled:
        return _node(out, (input,), lambda g: (g * mask,))
    return _constant(out)
