"""The fused kernels as autograd ops on ``Tensor``s, and an AdamW that steps in one launch.

Each op is one graph node whose forward and backward call the array-level kernels: the CUDA
ones (``neural_arch.backends.cupy_kernels``) for tensors on the GPU, the float64 references
(``kernels.reference``, results cast back to the input's dtype) for tensors on the CPU, so the
same code runs and is checked on either device. Results match ``neural_arch.functional``'s
``gelu``, ``cross_entropy`` and ``layer_norm`` up to float32 rounding.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np

from .. import backend_for
from ...core.grad_mode import GRAD_MODE
from ...core.tensor import Tensor, _constant, _node
from ...optim.adam import AdamW
from . import reference

_REDUCTIONS = ("mean", "sum", "none")
_FLOAT32 = np.dtype(np.float32)  # compared, not named: dtype.name costs microseconds


def kernels_for(array: Any) -> Any:
    """The module whose functions run on ``array``: CUDA kernels for CuPy, references else."""
    if backend_for(array).name == "cupy":
        from .. import cupy_kernels
        return cupy_kernels
    return reference


def _like(array: Any, ref: Any) -> Any:
    return array if array.dtype == ref.dtype else array.astype(ref.dtype)


def _record(out: Any, parents: Tuple[Tensor, ...], backward: Callable) -> Tensor:
    if GRAD_MODE.enabled and any(p.requires_grad for p in parents):
        return _node(out, parents, backward)
    return _constant(out)


def fused_bias_gelu(x: Tensor, bias: Optional[Tensor] = None,
                    approximate: str = "none") -> Tensor:
    """gelu(x + bias) as one node (``bias`` broadcast over the last dimension)."""
    kernels, xd = kernels_for(x.data), x.data
    bd = None if bias is None else bias.data
    out = _like(kernels.bias_gelu_forward(xd, bd, approximate), xd)

    def backward(g: Any) -> tuple:
        # the engine passes gradients on in whatever dtype they arrive (a float64 weight
        # downstream makes them float64); the kernels take the input's float32
        gx, gb = kernels.bias_gelu_backward(_like(g, xd), xd, bd, approximate)
        return (_like(gx, xd),) if bias is None else (_like(gx, xd), _like(gb, bd))

    return _record(out, (x,) if bias is None else (x, bias), backward)


def fused_cross_entropy(logits: Tensor, target: Any, reduction: str = "mean",
                        ignore_index: int = -100, label_smoothing: float = 0.0) -> Tensor:
    """Softmax cross-entropy of (rows, classes) logits and integer targets (rows,)."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"fused_cross_entropy: reduction must be one of {_REDUCTIONS}, got "
                         f"{reduction!r}")
    kernels, z = kernels_for(logits.data), logits.data
    xp = backend_for(z).xp
    t = xp.asarray(target.data if isinstance(target, Tensor) else target)
    loss_rows, lse = kernels.cross_entropy_forward(z, t, ignore_index, label_smoothing)
    loss_rows = _like(loss_rows, z)
    count = None
    if reduction == "mean":
        count = int((t != ignore_index).sum())
        out = loss_rows.sum() / count if count else loss_rows.sum() * float("nan")
    else:
        out = loss_rows.sum() if reduction == "sum" else loss_rows

    def backward(g: Any) -> tuple:
        if reduction == "none":
            per_row = g
        else:  # d(loss)/d(row loss) is 1/count for a mean, 1 for a sum
            scale = g if reduction == "sum" else (g / count if count else g * 0)
            per_row = xp.broadcast_to(scale, (z.shape[0],))
        per_row = _like(xp.ascontiguousarray(per_row), z)
        grad = kernels.cross_entropy_backward(per_row, z, t, lse, ignore_index, label_smoothing,
                                              check_targets=False)  # the forward checked them
        return (_like(grad, z),)

    return _record(out, (logits,), backward)


def fused_layer_norm(x: Tensor, normalized_shape: Union[int, Sequence[int]],
                     weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                     eps: float = 1e-5) -> Tensor:
    """LayerNorm over the trailing ``normalized_shape`` dimensions, as one node."""
    shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    xd = x.data
    if not shape or tuple(xd.shape[xd.ndim - len(shape):]) != shape or xd.ndim < len(shape):
        raise ValueError(f"fused_layer_norm: normalized_shape {shape} does not match the "
                         f"trailing dimensions of input shape {tuple(xd.shape)}")
    cols = 1
    for n in shape:
        cols *= int(n)
    flat = lambda t: None if t is None else t.data.reshape(cols)  # noqa: E731
    kernels, x2 = kernels_for(xd), xd.reshape(-1, cols)
    wd, bd = flat(weight), flat(bias)
    y, mean, rstd = kernels.layer_norm_forward(x2, wd, bd, eps)
    out = _like(y, xd).reshape(xd.shape)

    def backward(g: Any) -> tuple:
        g2 = _like(g, xd).reshape(-1, cols)  # in the input's dtype, as in fused_bias_gelu
        dx, dw, db = kernels.layer_norm_backward(g2, x2, wd, mean, rstd)
        grads: List[Any] = [_like(dx, xd).reshape(xd.shape)]
        if weight is not None:
            grads.append(_like(dw, weight.data).reshape(weight.data.shape))
        if bias is not None:
            grads.append(_like(db, bias.data).reshape(bias.data.shape))
        return tuple(grads)

    parents = tuple(t for t in (x, weight, bias) if t is not None)
    return _record(out, parents, backward)


def optimizer_kernels(array: Any) -> Any:
    """The kernels ``FusedAdamW`` uses for a parameter array, or None to use AdamW's rule."""
    return kernels_for(array) if backend_for(array).name == "cupy" else None


class FusedAdamW(AdamW):
    """``AdamW`` whose float32, C-contiguous GPU parameters are updated by one kernel launch per
    parameter group (and step count). Other parameters (CPU, float64, AMSGrad groups) take
    ``AdamW``'s own step; state and ``state_dict`` are ``AdamW``'s."""

    def step(self, closure: Optional[Callable[[], Any]] = None) -> Any:
        loss = self._evaluate_closure(closure)
        leftover_groups = []
        for group in self.param_groups:
            batches: Dict[Tuple[int, int], List[Any]] = {}
            leftover = []
            for param in group["params"]:
                if param.grad is None:
                    continue
                kernels = None if group["amsgrad"] else optimizer_kernels(param.data)
                if kernels is None or not _fusable(param):
                    leftover.append(param)
                    continue
                state = self.state[param]
                if not state:
                    xp = backend_for(param.data).xp
                    state.update(step=0, exp_avg=xp.zeros_like(param.data),
                                 exp_avg_sq=xp.zeros_like(param.data))
                state["step"] += 1
                batches.setdefault((id(kernels), state["step"]), [kernels]).append(param)
            for (_, step), (kernels, *params) in batches.items():
                self._fused_update(kernels, params, group, step)
            leftover_groups.append(dict(group, params=leftover))
        if any(g["params"] for g in leftover_groups):
            groups, self.param_groups = self.param_groups, leftover_groups
            try:
                super().step()
            finally:
                self.param_groups = groups
        return loss

    def _fused_update(self, kernels: Any, params: List[Any], group: dict, step: int) -> None:
        beta1, beta2 = group["betas"]
        states = [self.state[p] for p in params]
        kernels.adamw_step([p.data for p in params], [p.grad for p in params],
                           [s["exp_avg"] for s in states], [s["exp_avg_sq"] for s in states],
                           step=step, lr=group["lr"], beta1=beta1, beta2=beta2, eps=group["eps"],
                           weight_decay=group["weight_decay"], maximize=group["maximize"])


def _fusable(param: Any) -> bool:
    data, grad = param.data, param.grad
    return (data.dtype == _FLOAT32 and grad.dtype == _FLOAT32
            and data.flags.c_contiguous and grad.shape == data.shape)


__all__ = ["FusedAdamW", "fused_bias_gelu", "fused_cross_entropy", "fused_layer_norm",
           "kernels_for", "optimizer_kernels"]
