"""``index_put``: ``x`` with ``value`` written at ``index``, out of place and differentiable;
what a recorded ``x[index] = value`` computes (``Tensor.__setitem__``)."""
from __future__ import annotations

from typing import Any

from .broadcast import unbroadcast
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node


def index_put(x: Tensor, index: Any, value: Any) -> Tensor:
    """A copy of ``x`` with ``out[index] = value``: the gradient reaches ``x`` where it was not
    overwritten and ``value`` (summed over its broadcast) where it was."""
    xd = x.array
    vt = value if isinstance(value, Tensor) else None
    vd = value.array if vt is not None else value
    out = xd.copy()
    try:
        out[index] = vd
    except ValueError:
        raise ValueError(f"index_put: value of shape {tuple(getattr(vd, 'shape', ()))} cannot "
                         f"be written into the selection of a tensor of shape {xd.shape}"
                         ) from None
    need_x = x.requires_grad
    need_v = vt is not None and vt.requires_grad
    if not ((need_x or need_v) and GRAD_MODE.enabled):
        return _constant(out)
    value_shape = tuple(getattr(vd, "shape", ()))

    def backward(g: Any) -> tuple:
        gx = None
        if need_x:
            gx = g.copy()
            gx[index] = 0
        if vt is None:
            return (gx,)
        return gx, (unbroadcast(g[index], value_shape) if need_v else None)

    return _node(out, (x,) if vt is None else (x, vt), backward)
