"""torch's Tensor methods beyond the operators: sizes (``size()``, ``numel()``, ``dim()``,
``stride()``), conversions (``to``, ``type_as``, ``int()``, ``half()``, ``bfloat16()``,
``bool()``), ``view``, ``t()``, ``contiguous()`` and ``is_contiguous()`` with torch's
``memory_format`` (``torch_memory_format``), and the pieces, gather/scatter and selection
methods.

A base class of ``Tensor``. As in ``tensor.py``, methods that are op functions are named
through ``OpRef`` stand-ins, which the bottom of ``tensor.py`` binds once the op modules load.
"""
from __future__ import annotations

import importlib
from typing import Any

from ..backends import xp_of
from . import torch_memory_format as formats
from .op_refs import OpRef
from .torch_size import Size

_pieces, _gather, _select = (OpRef(name) for name in ("ops_pieces", "ops_gather", "ops_select"))


def _core(module: str) -> Any:
    """A core module that imports ``tensor.py`` (which imports this one first)."""
    return importlib.import_module(f"{__package__}.{module}")


class TorchTensorMethods:
    """Mixed into ``Tensor``; relies on its ``data`` and on the ops bound to it."""

    __slots__ = ()

    # ----------------------------------------------------------------- sizes
    def size(self, dim: Any = None) -> Any:
        """The shape as a ``Size``, or the length of dimension ``dim`` as an int."""
        shape = self.array.shape
        if dim is None:
            return Size(shape)
        ndim = max(len(shape), 1)
        if isinstance(dim, bool) or not isinstance(dim, int) or not -ndim <= dim < ndim:
            raise IndexError(f"Dimension out of range (expected to be in range of "
                             f"[{-ndim}, {ndim - 1}], but got {dim})")
        return shape[dim] if shape else 1

    def numel(self) -> int:
        """The number of elements."""
        return int(self.array.size)

    nelement = numel

    def dim(self) -> int:
        return self.array.ndim

    def element_size(self) -> int:
        """Bytes per element."""
        return self.array.dtype.itemsize

    def stride(self, dim: Any = None) -> Any:
        """The strides in elements (torch counts elements, NumPy bytes), or dimension
        ``dim``'s."""
        item = self.array.itemsize
        strides = tuple(s // item for s in self.array.strides)
        if dim is None:
            return strides
        self.size(dim)  # torch's IndexError for a dimension out of range
        return strides[dim] if strides else 1

    def is_contiguous(self, memory_format: Any = formats.contiguous_format) -> bool:
        """Whether the data is laid out densely in ``memory_format`` (default: row-major;
        ``torch.channels_last``: a 4-D tensor stored as N, H, W, C)."""
        return formats.is_contiguous_as(
            self.array, formats.checked_format(memory_format, "is_contiguous"))

    def contiguous(self, memory_format: Any = formats.contiguous_format) -> Any:
        """This tensor when laid out in ``memory_format`` already, else a copy that is (in the
        graph; the gradient passes through unchanged)."""
        fmt = formats.checked_format(memory_format, "contiguous")
        if fmt is formats.preserve_format:
            raise RuntimeError("preserve memory format is unsupported by the contiguous "
                               "operator")
        if fmt is formats.contiguous_format:
            return self._row_major()
        return self._in_memory_format(fmt, "contiguous")

    def _in_memory_format(self, fmt: Any, op: str, always_copy: bool = False) -> Any:
        laid_out = formats.in_format(self.array, fmt, op, always_copy)
        if laid_out is self.array:
            return self
        return _core("tensor").make_result(laid_out, (self,), lambda g: (g,))

    def view(self, *shape: Any) -> Any:
        """The same data seen with ``shape`` (one entry may be -1), sharing memory and the
        version counter. Data that no such view can show (a transposed matrix flattened)
        raises RuntimeError, as torch's ``view``; ``reshape`` copies there."""
        out = self.reshape(*shape)
        xd, od = self.array, out.array
        if od.size and not (od.base is not None and xp_of(xd).may_share_memory(od, xd)):
            raise RuntimeError(
                f"view size is not compatible with input tensor's size and stride (at least "
                f"one dimension spans across two contiguous subspaces): a tensor of shape "
                f"{tuple(xd.shape)} with strides {tuple(xd.strides)} cannot be viewed as "
                f"{tuple(od.shape)}. Use .reshape(...) instead.")
        return out

    def t(self) -> Any:
        """The transpose of a 2-D tensor; 0-D and 1-D tensors come back as they are."""
        if self.array.ndim > 2:
            raise RuntimeError(f"t() expects a tensor with <= 2 dimensions, but self is "
                               f"{self.array.ndim}D")
        return self.transpose(0, 1) if self.array.ndim == 2 else self

    # ----------------------------------------------------------------- conversions
    def to(self, *args: Any, **kwargs: Any) -> Any:
        """``to(device)``, ``to(dtype)``, ``to(device, dtype)``, ``to(other_tensor)`` (its
        device and dtype), with torch's keywords ``device=``, ``dtype=``, ``non_blocking=``,
        ``copy=`` (a copy even when nothing changes) and ``memory_format=`` (the layout of the
        result; default ``torch.preserve_format``). Differentiable."""
        kwargs.pop("non_blocking", None)
        copy = kwargs.pop("copy", False)
        fmt = formats.checked_format(kwargs.pop("memory_format", None) or formats.preserve_format,
                                     "to")  # None means preserve_format, as in torch
        if args and isinstance(args[0], _core("tensor").Tensor):
            other, args = args[0], args[1:]
            kwargs.setdefault("device", other.device)
            kwargs.setdefault("dtype", other.dtype)
        if len(args) > 2 or set(kwargs) - {"device", "dtype"}:
            raise TypeError(f"to() takes (device, dtype) or (tensor), got {len(args)} "
                            f"positional arguments and keywords {sorted(kwargs)}")
        out = _core("ops_misc").to(self, *args, **kwargs)
        # as torch: the tensor stays when its layout already suggests the format asked for
        if fmt is not formats.preserve_format and formats.suggested_format(out.array) is not fmt:
            out = out._in_memory_format(fmt, "to", always_copy=True)
        return out.clone() if copy and out is self else out

    def type_as(self, other: Any) -> Any:
        """This tensor cast to ``other``'s dtype."""
        return self.astype(other.dtype)

    # ----------------------------------------------------------------- pieces and selection
    repeat, split, chunk, unbind = _pieces.repeat, _pieces.split, _pieces.chunk, _pieces.unbind
    _row_major = _pieces.contiguous  # contiguous() in the default format
    gather, scatter, scatter_add = _gather.gather, _gather.scatter, _gather.scatter_add
    sort, argsort, topk = _select.sort, _select.argsort, _select.topk

    def where(self, condition: Any, other: Any) -> Any:
        """``where(condition, self, other)``: self where ``condition`` holds, else ``other``."""
        return _core("ops_shape").where(condition, self, other)

    # Last: these names shadow the builtins in the rest of the class body.
    def int(self) -> Any:
        return self.astype("int32")

    def half(self) -> Any:
        return self.astype("float16")

    def bfloat16(self) -> Any:
        return self.astype("bfloat16")

    def bool(self) -> Any:
        return self.astype("bool")
