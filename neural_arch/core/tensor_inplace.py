"""torch's in-place methods for ``Tensor``: ``zero_``, ``fill_``, ``normal_``, ``uniform_``,
``copy_``, ``add_``, ``sub_``, ``mul_``, ``div_``, ``clamp_``, ``masked_fill_``.

Each writes into ``.array``, adds one to the tensor's version counter and returns the tensor.
The autograd rules are torch's: while gradients are recorded, an in-place op on a leaf that
requires grad (or a view of one) raises; on any other tensor, when it or an argument requires
grad, the op is recorded: the out-of-place form is computed from a stand-in for the old value,
written into the data, and the tensor takes its history (``inplace_graph``). A tensor that
shares its storage with a view cannot be recorded that way (torch rewrites the view's history
too) and raises; so does ``div_`` with a ``rounding_mode``. Under ``no_grad()`` (how
initialisers and optimizers use these methods) they simply write. A backward that needs values
written over since raises (``versions``).
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


def _needs_grad(value: Any) -> bool:
    return isinstance(value, _tensor_type()) and value.requires_grad


def _value(other: Any) -> Any:
    return other.array if isinstance(other, _tensor_type()) else other


class InPlaceMethods:
    """Mixed into ``Tensor``; relies on its ``data``, ``requires_grad`` and ``is_leaf``."""

    __slots__ = ()

    def _records(self, op: str, *others: Any) -> bool:
        """Whether in-place ``op`` must be recorded in the graph (after torch's checks)."""
        if not GRAD_MODE.enabled:
            return False
        tensor = _tensor_type()
        if not (self.requires_grad
                or any(isinstance(o, tensor) and o.requires_grad for o in others)):
            return False
        if self.requires_grad and self.is_leaf:
            raise RuntimeError(f"{op}: a leaf Variable that requires grad is being used in an "
                               "in-place operation.")
        if len(self._vc) > 1:  # the storage has views (versions.share_counter marks it)
            base = self._parents[0] if self._parents else None
            if base is not None and base.is_leaf and base.requires_grad and base._vc is self._vc:
                raise RuntimeError(f"{op}: a view of a leaf Variable that requires grad is "
                                   "being used in an in-place operation.")
            raise RuntimeError(f"{op}: this tensor shares its storage with a view, and in-place "
                               "operations on such tensors are not recorded in the graph here; "
                               f"write into a clone() or use the out-of-place form")
        return True

    def _record(self, compute: Any, *others: Any, keep_values: bool = False) -> Any:
        """Record an in-place op: ``compute(old, *others)`` is its out-of-place form (``self``
        among ``others`` reads as the old value); ``keep_values``: its backward reads the old
        values, so they are kept in a copy."""
        from .inplace_graph import rebase, stand_in
        old = stand_in(self, keep_values)
        result = compute(old, *(old if o is self else o for o in others))
        xd = self.array
        if tuple(result.array.shape) != tuple(xd.shape):
            raise RuntimeError(f"output with shape {list(xd.shape)} doesn't match the broadcast "
                               f"shape {list(result.array.shape)}")
        xp_of(xd).copyto(xd, result.array, casting="unsafe")
        self._vc[0] += 1
        rebase(self, old, result)
        return self

    def _check_inplace(self, op: str, *others: Any) -> Any:
        """The data to write into, once the write is known not to need recording."""
        self._vc[0] += 1
        return self.array

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
        if self._records("add_", other):
            return self._record(lambda old, o: old + (o if alpha == 1 else o * alpha), other)
        return self._apply_ufunc("add_", "add", other if alpha == 1 else _value(other) * alpha)

    def sub_(self, other: Any, *, alpha: Any = 1) -> Any:
        """``self -= alpha * other``."""
        if self._records("sub_", other):
            return self._record(lambda old, o: old - (o if alpha == 1 else o * alpha), other)
        return self._apply_ufunc("sub_", "subtract",
                                 other if alpha == 1 else _value(other) * alpha)

    def mul_(self, other: Any) -> Any:
        if self._records("mul_", other):
            return self._record(lambda old, o: old * o, other, keep_values=_needs_grad(other))
        return self._apply_ufunc("mul_", "multiply", other)

    def div_(self, other: Any, *, rounding_mode: Any = None) -> Any:
        """True division, or ``rounding_mode`` "trunc" / "floor" of it, as in torch."""
        recorded = self._records("div_", other)
        if rounding_mode is None:
            if recorded:
                return self._record(lambda old, o: old / o, other)
            return self._apply_ufunc("div_", "true_divide", other)
        if recorded:
            raise RuntimeError("div_ with a rounding_mode is not recorded in the graph; use "
                               "torch.div(x, y, rounding_mode=...) out of place or no_grad()")
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
        if self._records("clamp_", min, max):
            return self._record(lambda old: old.clamp(min, max), keep_values=True)
        xd = self._check_inplace("clamp_", min, max)
        xp_of(xd).clip(xd, _value(min), _value(max), out=xd)
        return self

    def relu_(self) -> Any:
        # relu's backward reads only where the input was positive, which the written result
        # still tells, so the old values need no copy
        if self._records("relu_"):
            return self._record(lambda old: old.relu())
        xd = self._check_inplace("relu_")
        xp_of(xd).maximum(xd, 0, out=xd)
        return self

    def zero_(self) -> Any:
        if self._records("zero_"):
            return self._record(lambda old: old.masked_fill(True, 0))
        self._check_inplace("zero_")[...] = 0
        return self

    def fill_(self, value: Any) -> Any:
        if isinstance(value, _tensor_type()) and value.array.ndim:
            raise RuntimeError(f"fill_ only supports 0-dimension value tensor but got tensor "
                               f"with {value.array.ndim} dimensions")
        if self._records("fill_", value):
            if isinstance(value, _tensor_type()):
                return self._record(lambda old, v: old.masked_fill(True, 0) + v, value)
            return self._record(lambda old: old.masked_fill(True, value))
        self._check_inplace("fill_", value)[...] = _value(value)
        return self

    def copy_(self, src: Any, non_blocking: bool = False) -> Any:
        """Write ``src`` (broadcast to this shape, cast to this dtype and device) into self."""
        if self._records("copy_", src):
            if isinstance(src, _tensor_type()):
                return self._record(lambda old, s: old.masked_fill(True, 0) + s, src)
            return self._record(lambda old: old.masked_fill(True, backend_for(old.array)
                                                            .asarray(src)))
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
        if self._records("masked_fill_", value):
            return self._record(lambda old: old.masked_fill(mask, value))
        xd = self._check_inplace("masked_fill_", value)
        xp = xp_of(xd)
        try:
            xp.copyto(xd, xp.asarray(_value(value), dtype=xd.dtype), where=maskd)
        except ValueError:
            raise RuntimeError(f"masked_fill_: mask of shape {tuple(maskd.shape)} cannot be "
                               f"broadcast to the tensor's shape {tuple(xd.shape)}") from None
        return self

    def _fill_random(self, op: str, draw: Any, generator: Any) -> Any:
        xd = self.array
        if not is_floating(xd.dtype):
            raise RuntimeError(f"{op} expects a floating point tensor, got dtype {xd.dtype}")
        recorded = self._records(op)
        samples = draw(resolve_generator(generator), xd.shape)
        samples = backend_for(xd).asarray(samples.astype(xd.dtype, copy=False))
        if recorded:
            return self._record(lambda old: old.masked_fill(True, samples))
        self._check_inplace(op)[...] = samples
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
