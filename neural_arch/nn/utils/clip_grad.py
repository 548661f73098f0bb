"""torch's ``clip_grad_norm_`` signature and return type over the optimizers' clipping code."""
from __future__ import annotations

from typing import Any, Iterable, Optional, Union

import numpy as np

from ...core import Tensor
from ...optim import clip_grad as _clip
from ...optim.clip_grad import clip_grad_value_

__all__ = ["clip_grad_norm_", "clip_grad_value_"]


def clip_grad_norm_(parameters: Union[Any, Iterable[Any]], max_norm: float,
                    norm_type: float = 2.0, error_if_nonfinite: bool = False,
                    foreach: Optional[bool] = None) -> Tensor:
    """Scale all gradients together so their joint ``norm_type`` norm is at most ``max_norm``;
    returns the total norm before clipping as a 0-d Tensor in the gradients' dtype, as PyTorch.

    ``foreach`` is accepted for PyTorch's signature; the clipping is the same either way.
    """
    if hasattr(parameters, "grad") and hasattr(parameters, "array"):
        parameters = [parameters]
    parameters = list(parameters)  # read twice: a generator would be empty the second time
    total = _clip.clip_grad_norm_(parameters, max_norm, norm_type=norm_type,
                                  error_if_nonfinite=error_if_nonfinite)
    grads = [p.grad.array for p in parameters if p.grad is not None]
    dtype = grads[0].dtype if grads else np.float32
    return Tensor(np.asarray(total, dtype=dtype))
