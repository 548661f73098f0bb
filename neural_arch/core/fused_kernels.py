"""The fused kernels as autograd ops on ``Tensor``s.

Each op is one graph node whose forward and backward call the array-level kernels: the CUDA
ones (``neural_arch.backends.cupy_kernels``) for tensors on the GPU, the float64 references
(``backends.kernels.reference``, results cast back to the input's dtype) for tensors on the
CPU, so the same code runs and is checked on either device. Results match
``neural_arch.functional``'s ``gelu``, ``cross_entropy`` and ``layer_norm`` up to float32
rounding. They live in the core, not with the kernels, because they build graph nodes: the
backends stay array-level and import nothing from the layers above them.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional, Sequence, Tuple, Union

from ..backends import backend_for
from ..backends.kernels.dispatch import kernels_for
from .grad_mode import GRAD_MODE
from .tensor import Tensor, _constant, _node
from .versions import check_saved, saved_entry

_REDUCTIONS = ("mean", "sum", "none")


def _like(array: Any, ref: Any) -> Any:
    return array if array.dtype == ref.dtype else array.astype(ref.dtype)


def _record(out: Any, parents: Tuple[Tensor, ...], backward: Callable) -> Tensor:
    if GRAD_MODE.enabled and any(p.requires_grad for p in parents):
        return _node(out, parents, backward)
    return _constant(out)


def fused_bias_gelu(x: Tensor, bias: Optional[Tensor] = None,
                    approximate: str = "none") -> Tensor:
    """gelu(x + bias) as one node (``bias`` broadcast over the last dimension)."""
    kernels, xd = kernels_for(x.array), x.array
    bd = None if bias is None else bias.array
    out = _like(kernels.bias_gelu_forward(xd, bd, approximate), xd)
    saved = (saved_entry(x),)  # as the unfused gelu (torch saves x + bias, made inside)

    def backward(g: Any) -> tuple:
        check_saved("GeluBackward", saved)
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
    kernels, z = kernels_for(logits.array), logits.array
    xp = backend_for(z).xp
    t = xp.asarray(target.array if isinstance(target, Tensor) else target)
    loss_rows, lse = kernels.cross_entropy_forward(z, t, ignore_index, label_smoothing)
    loss_rows = _like(loss_rows, z)
    count = None
    if reduction == "mean":
        count = int((t != ignore_index).sum())
        out = loss_rows.sum() / count if count else loss_rows.sum() * float("nan")
    else:
        out = loss_rows.sum() if reduction == "sum" else loss_rows

    saved = (saved_entry(target),) if isinstance(target, Tensor) else ()

    def backward(g: Any) -> tuple:
        check_saved("NllLossBackward", saved)
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
    xd = x.array
    if not shape or tuple(xd.shape[xd.ndim - len(shape):]) != shape or xd.ndim < len(shape):
        raise ValueError(f"fused_layer_norm: normalized_shape {shape} does not match the "
                         f"trailing dimensions of input shape {tuple(xd.shape)}")
    cols = 1
    for n in shape:
        cols *= int(n)
    flat = lambda t: None if t is None else t.array.reshape(cols)  # noqa: E731
    kernels, x2 = kernels_for(xd), xd.reshape(-1, cols)
    wd, bd = flat(weight), flat(bias)
    y, mean, rstd = kernels.layer_norm_forward(x2, wd, bd, eps)
    out = _like(y, xd).reshape(xd.shape)
    parents = tuple(t for t in (x, weight, bias) if t is not None)
    saved = tuple(saved_entry(t) for t in parents)  # as the unfused layer_norm

    def backward(g: Any) -> tuple:
        check_saved("NativeLayerNormBackward", saved)
        g2 = _like(g, xd).reshape(-1, cols)  # in the input's dtype, as in fused_bias_gelu
        dx, dw, db = kernels.layer_norm_backward(g2, x2, wd, mean, rstd)
        grads: List[Any] = [_like(dx, xd).reshape(xd.shape)]
        if weight is not None:
            grads.append(_like(dw, weight.array).reshape(weight.array.shape))
        if bias is not None:
            grads.append(_like(db, bias.array).reshape(bias.array.shape))
        return tuple(grads)

    return _record(out, parents, backward)


__all__ = ["fused_bias_gelu", "fused_cross_entropy", "fused_layer_norm"]
