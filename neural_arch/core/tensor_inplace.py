"""torch's in-place methods for ``Tensor``: ``zero_``, ``fill_``, ``normal_``, ``uniform_``,
``copy_``, ``add_``, ``sub_``, ``mul_``, ``div_``, ``clamp_``, ``masked_fill_``.

Each writes into ``.data`` and returns the tensor. Tensors hold no version counter, so an
in-place write cannot be recorded in, or checked against, the autograd graph. The rule is
therefore the safe subset of torch's: while gradients are recorded, an in-place op on a tensor
that requires grad (a leaf, as in torch, or an op output), or with an argument that requires
grad, raises; under ``no_grad()`` (how initialisers use these methods) it simply writes.
Writing into a tensor that a recorded op saved for its backward changes that op's gradient
(torch would raise there), so do such writes before the forward pass or on a clone.
"""
from __future__ import annotations

from typing import Any

from ..backends import backend_for, xp_of
from .dtypes import is_floating
from .generator import resolve_generator
from .grad_mode import GRAD_MODE


def _tensor_type() -> type:
    from .tensor import Tensor  # this module is a base of Tensor, so it comes first
    return Tensor


def _value(other: Any) -> Any:
    return other.data if isinstance(other, _tensor_type()) else other


class InPlaceMethods:
    """Mixed into ``Tensor``; relies on its ``data``, ``requires_grad`` and ``is_leaf``."""

    __slots__ = ()

    def _check_inplace(self, op: str, *others: Any) -> Any:
        """The data to write into, after torch's autograd checks for in-place ``op``."""
        if GRAD_MODE.enabled:
            if self.requires_grad and self.is_leaf:
                raise RuntimeError(f"{op}: a leaf Variable that requires grad is being used in "
                                   "an in-place operation (run it under no_grad())")
            if self.requires_grad:
                raise RuntimeError(f"{op}: in-place operations on a tensor that is part of the "
                                   f"autograd graph are not supported; use the out-of-place "
                                   f"form (x = x.{op.rstrip('_')}(...)) or no_grad()")
            tensor = _tensor_type()
            if any(isinstance(o, tensor) and o.requires_grad for o in others):
                raise RuntimeError(f"{op}: an argument requires grad, and in-place results are "
                                   "not recorded in the graph; use the out-of-place form")
        return self.data

    def _apply_ufunc(self, op: str, ufunc_name: str, other: Any) -> Any:
        xd = self._check_inplace(op, other)
        xp = xp_of(xd)
        operand = _value(other)
        try:
            getattr(xp, ufunc_name)(xd, operand, out=xd)
        except TypeError as exc:  # NumPy's casting error: float result into an int tensor
            raise RuntimeError(f"{op}: the result cannot be cast to the tensor's dtype "
                               f"{xd.dtype} ({exc})") from None
        except ValueError:
            raise RuntimeError(f"{op}: output with shape {tuple(xd.shape)} doesn't match the "
                               f"broadcast shape of the operand "
                               f"{tuple(getattr(operand, 'shape', ()))}") from None
        return self

    def add_(self, other: Any, *, alpha: Any = 1) -> Any:
        """``self += alpha * other``."""
        return self._apply_ufunc("add_", "add", other if alpha == 1 else _value(other) * alpha)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Any:
        """``self -= alpha * other``."""
        return self._apply_ufunc("sub_", "subtract",
                                 other if alpha == 1 else _value(other) * alpha)

    def mul_(self, other: Any) -> Any:
        return self._apply_ufunc("mul_", "multiply", other)

    def div_(self, other: Any, *, rounding_mode: Any = None) -> Any:
        """True division, or ``rounding_mode`` "trunc" / "floor" of it, as in torch."""
        if rounding_mode is None:
            return self._apply_ufunc("div_", "true_divide", other)
        if rounding_mode not in ("trunc", "floor"):
            raise ValueError(f"div_ expected rounding_mode to be one of None, 'trunc', or "
                             f"'floor' but found {rounding_mode!r}")
        xd = self._check_inplace("div_", other)
        xp = xp_of(xd)
        operand = _value(other)
        if rounding_mode == "floor":
            exact = xp.floor_divide(xd, operand)
        else:
            exact = xp.trunc(xp.true_divide(xd, operand))
        return self.copy_(exact)

    def clamp_(self, min: Any = None, max: Any = None) -> Any:
        if min is None and max is None:
            raise RuntimeError("clamp_: at least one of 'min' or 'max' must not be None")
        xd = self._check_inplace("clamp_", min, max)
        xp_of(xd).clip(xd, _value(min), _value(max), out=xd)
        return self

    def zero_(self) -> Any:
        self._check_inplace("zero_")[...] = 0
        return self

    def fill_(self, value: Any) -> Any:
        if isinstance(value, _tensor_type()) and value.data.ndim:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                               f"with {value.data.ndim} dimensions")
        self._check_inplace("fill_", value)[...] = _value(value)
        return self

    def copy_(self, src: Any, non_blocking: bool = False) -> Any:
        """Write ``src`` (broadcast to this shape, cast to this dtype and device) into self."""
        xd = self._check_inplace("copy_", src)
        values = backend_for(xd).asarray(_value(src))
        try:
            xd[...] = values
        except ValueError:
            raise RuntimeError(f"copy_: source of shape {tuple(values.shape)} cannot be "
                               f"broadcast to the tensor's shape {tuple(xd.shape)}") from None
        return self

    def masked_fill_(self, mask: Any, value: Any) -> Any:
        """Write ``value`` where the boolean ``mask`` (broadcast to this shape) is True."""
        maskd = _value(mask)
        if getattr(maskd, "dtype", None) is None or maskd.dtype.kind != "b":
            raise RuntimeError(f"masked_fill_ only supports boolean masks, but got mask with "
                               f"dtype {getattr(maskd, 'dtype', type(maskd).__name__)}")
        xd = self._check_inplace("masked_fill_", value)
        xp = xp_of(xd)
        try:
            xp.copyto(xd, xp.asarray(_value(value), dtype=xd.dtype), where=maskd)
        except ValueError:
            raise RuntimeError(f"masked_fill_: mask of shape {tuple(maskd.shape)} cannot be "
                               f"broadcast to the tensor's shape {tuple(xd.shape)}") from None
        return self

    def _fill_random(self, op: str, draw: Any, generator: Any) -> Any:
        xd = self._check_inplace(op)
        if not is_floating(xd.dtype):
            raise RuntimeError(f"{op} expects a floating point tensor, got dtype {xd.dtype}")
        samples = draw(resolve_generator(generator), xd.shape)
        xd[...] = backend_for(xd).asarray(samples.astype(xd.dtype, copy=False))
        return self

    def normal_(self, mean: Any = 0.0, std: Any = 1.0, *, generator: Any = None) -> Any:
        """Fill with samples of N(mean, std**2) (``generator``: a ``Generator`` or None)."""
        if std < 0:
            raise RuntimeError(f"normal_ expects std >= 0.0, but found std {std}")
        return self._fill_random(
            "normal_", lambda rng, shape: rng.normal(mean, std, shape), generator)

    def uniform_(self, *bounds: Any, generator: Any = None, **torch_names: Any) -> Any:
        """Fill with samples of U[from, to): ``uniform_(a, b)`` or torch's
        ``uniform_(from=a, to=b)``; the default range is [0, 1)."""
        low = torch_names.pop("from", bounds[0] if bounds else 0.0)
        high = torch_names.pop("to", bounds[1] if len(bounds) > 1 else 1.0)
        if torch_names or len(bounds) > 2:
            raise TypeError(f"uniform_() takes (from=0, to=1, *, generator=None), got extra "
                            f"{sorted(torch_names) or bounds[2:]}")
        if low > high:
            raise RuntimeError(f"uniform_ expects to return a [from, to) range, but found "
                               f"from={low} > to={high}")
        return self._fill_random(
            "uniform_", lambda rng, shape: rng.uniform(low, high, shape), generator)
