"""The autograd side of ``Tensor``: ``requires_grad_``, ``detach``, ``backward``, hooks,
``retain_grad``, the version counter (``_version``) and item assignment (``t[i] = v``).

A base class of ``Tensor``, kept apart so that ``tensor.py`` stays about the array, the
conversions and the operator table. ``x[i] = v`` is an in-place write: under recorded
gradients it follows the rules of ``tensor_inplace`` (refused on a leaf that requires grad,
recorded on other tensors).
"""
from __future__ import annotations

import importlib
from typing import Any, Callable, Optional

from . import autograd
from .dtypes import is_floating
from .grad_mode import GRAD_MODE


_tensor = None  # the module, found on first use (every gradient assignment asks for it)


def _tensor_module() -> Any:
    # tensor.py imports this module first; `from . import tensor` would find the package's
    # `tensor()` factory instead of the module
    global _tensor
    if _tensor is None:
        _tensor = importlib.import_module(f"{__package__}.tensor")
    return _tensor


class AutogradMethods:
    """Mixed into ``Tensor``; relies on its slots (``array``, ``requires_grad``, ``_parents``,
    ``_backward``, ``_meta``, ``_vc``) and on ``tensor_inplace``'s recording helpers."""

    __slots__ = ()

    @property
    def is_leaf(self) -> bool:
        return self._backward is None

    @property
    def grad(self) -> Any:
        """The accumulated gradient, a tensor (as in torch), or None; its raw array is
        ``.grad.array``."""
        return self._grad

    @grad.setter
    def grad(self, value: Any) -> None:
        # Framework code assigns raw arrays (the engine, for every leaf of every backward); they
        # are wrapped here, so `.grad` is always a tensor. That path comes first and costs one
        # isinstance, one shape comparison and the wrapper.
        if value is None:
            self._grad = None
            return
        tensor = _tensor_module()
        if not isinstance(value, tensor.Tensor):
            current = self._grad
            if current is not None and value is current.array:
                return  # the same storage (a sync unpacked in place): the tensor stays the same
            shape = getattr(value, "shape", None)
            if shape is None or not hasattr(value, "dtype"):
                raise TypeError(f"assigned grad must be a Tensor, an array or None, got "
                                f"{type(value).__name__}")
            if shape == self.array.shape:  # NumPy and CuPy shapes are tuples
                self._grad = tensor._constant(value)
                return
            value = tensor._constant(value)
        if tuple(value.shape) != tuple(self.array.shape):
            raise RuntimeError(f"attempting to assign a gradient of size '{list(value.shape)}' to "
                               f"a tensor of size '{list(self.array.shape)}'. Please ensure that "
                               f"the gradient and the tensor are the same size")
        self._grad = value

    @property
    def grad_fn(self) -> Optional[Callable]:
        """None on a leaf (torch's test ``x.grad_fn is None``); otherwise the recorded backward
        closure (torch gives a graph node object; only its presence is the same here)."""
        return self._backward

    @property
    def _version(self) -> int:
        """How many in-place writes this tensor's storage has had (torch's ``_version``)."""
        return self._vc[0]

    def mark_modified_in_place(self) -> Any:
        """Count one in-place write into this tensor's storage made by code that autograd does
        not see (an optimizer updating ``.array``, a collective filling it): a backward that
        saved these values earlier then raises torch's "modified by an inplace operation"
        error instead of using the new ones. Shared with ``detach()`` and views, as every
        version count is. Returns the tensor.

        torch spells this ``torch.autograd.graph.increment_version(tensor)``, a function far
        from the tensor that most code never sees (its own optimizers get the count from
        ``add_``); a method that names the event reads plainly at every call site here, where
        optimizers and collectives write ``.array`` directly."""
        self._vc[0] += 1
        return self


    def detach(self) -> Any:
        """A tensor sharing this data and its version counter, cut from the graph."""
        out = _tensor_module()._constant(self.array)
        out._vc = self._vc
        return out

    @property
    def data(self) -> Any:
        """torch's ``.data``: a tensor sharing this storage, cut from the graph, with a version
        counter of its own, so in-place writes through it are not seen by autograd (as in
        torch). The raw NumPy or CuPy array is ``.array``."""
        return _tensor_module()._constant(self.array)

    @data.setter
    def data(self, value: Any) -> None:
        # torch rebinds the storage (shape and dtype may change); a raw array is taken as well.
        if isinstance(value, _tensor_module().Tensor):
            value = value.array
        elif not hasattr(value, "shape") or not hasattr(value, "dtype"):
            raise TypeError(f"data must be a Tensor or an array, got {type(value).__name__}")
        self.array = value

    def requires_grad_(self, flag: bool = True) -> Any:
        if flag and not is_floating(self.array.dtype):
            raise TypeError(f"only floating tensors can require grad, got dtype {self.dtype}")
        if not flag and not self.is_leaf:
            raise RuntimeError("requires_grad_(False) is only allowed on leaf tensors; "
                               "use detach() for a non-leaf")
        self.requires_grad = bool(flag)
        return self

    def zero_grad(self) -> None:
        """Forget the accumulated gradient (set ``.grad`` to None)."""
        self.grad = None

    def retain_grad(self) -> None:
        """Keep ``.grad`` on this non-leaf tensor during ``backward()``."""
        if not self.requires_grad:
            raise RuntimeError("retain_grad() on a tensor that does not require grad")
        if not self.is_leaf:
            self._get_meta()["retain"] = True

    def backward(self, gradient: Any = None, retain_graph: Optional[bool] = None) -> None:
        """Accumulate d(self)/d(leaf), times ``gradient``, into every leaf's ``.grad``.

        The graph is never freed by ``backward`` (it goes away with its output tensors), so
        calling it twice is allowed; ``retain_graph`` is accepted for PyTorch compatibility.
        """
        if not self.requires_grad:
            raise RuntimeError("backward() on a tensor that does not require grad and has no "
                               "grad_fn (did you forget requires_grad=True, or use no_grad()?)")
        seed, owned = autograd.make_seed(self, gradient)
        autograd.run_backward(self, seed, owned)

    def register_hook(self, fn: Callable[[Any], Any]) -> autograd.RemovableHandle:
        """Call ``fn(grad)`` once this tensor's gradient is complete (before a leaf accumulates
        it), ``grad`` a tensor as in torch; a tensor or array returned by ``fn`` replaces it."""
        if not self.requires_grad:
            raise RuntimeError("cannot register a hook on a tensor that does not require grad")
        return autograd.RemovableHandle(self._get_meta().setdefault("hooks", {})).add(fn)

    def register_post_accumulate_grad_hook(self, fn: Callable[[Any], Any]
                                           ) -> autograd.RemovableHandle:
        """Call ``fn(tensor)`` right after ``backward()`` updated this leaf's ``.grad``."""
        if not self.is_leaf or not self.requires_grad:
            raise RuntimeError("post-accumulate-grad hooks can only be registered on leaf "
                               "tensors that require grad")
        return autograd.RemovableHandle(self._get_meta().setdefault("post_hooks", {})).add(fn)

    def __setitem__(self, index: Any, value: Any) -> None:
        tensor = _tensor_module().Tensor
        if isinstance(index, tensor):
            index = index.array
        elif isinstance(index, tuple):
            index = tuple(i.array if isinstance(i, tensor) else i for i in index)
        if GRAD_MODE.enabled and self._records("__setitem__", value):
            from .ops_index_put import index_put
            self._record(lambda old, v: index_put(old, index, v), value)
            return
        self.array[index] = value.array if isinstance(value, tensor) else value
        self._vc[0] += 1
