"""``Tensor``: an array plus the record of how it was computed.

Every operator and method a Tensor has is named in the class body below or in one of its three
bases (``tensor_torch_api``: torch's further methods, ``view`` among them; ``tensor_autograd``:
``backward``, ``detach``, hooks, the version counter and ``t[i] = v``; ``tensor_inplace``:
``add_`` and the other in-place ones). The operations themselves live in the ``ops_*`` modules (which import this
one), so the bodies name them through ``op_refs.OpRef`` stand-ins that the bottom of this file
swaps for the functions.

An op output stores its parents and a backward closure ``grad -> tuple of parent grads``; the
engine in ``autograd.py`` walks that graph. Rarely used per-tensor state (name, hooks,
retain_grad) lives in one optional dict, ``_meta``, so creating an op output stays cheap.
"""
from __future__ import annotations

import itertools
from typing import Any, Callable, Optional, Tuple

from ..backends import backend_for, default_device, device_type, get_backend
from .dtypes import default_dtype_for, resolve_dtype
from .grad_mode import GRAD_MODE
from .op_refs import OpRef, bind_op_refs
from .tensor_autograd import AutogradMethods
from .tensor_inplace import InPlaceMethods
from .tensor_torch_api import TorchTensorMethods
from .tensor_torch_extras import TorchExtraMethods

_NUMPY = get_backend("numpy")
_NDARRAY = _NUMPY.array_type
_NUMPY_SCALAR = _NUMPY.array_types[1]
_as_numpy = _NUMPY.xp.asarray


def _to_array(data: Any, dtype: Any, device: Any) -> Any:
    # Host data (Python values, NumPy arrays) with device=None goes to the default device; a
    # Tensor or a device array is already placed and stays. Op results never come through here
    # (they are built by `_constant` / `_node`), so they keep their inputs' device.
    placed = False
    if type(data) is _NDARRAY:  # the common case first
        array = data
    elif isinstance(data, Tensor):
        array, placed = data.array, True
    elif isinstance(data, _NUMPY.array_types):  # NumPy scalars and ndarray subclasses
        array = _as_numpy(data)
    elif hasattr(data, "__cuda_array_interface__"):
        array, placed = data, True
    else:
        array = _as_numpy(data)
        if array.dtype.kind not in "biuf":
            raise TypeError(f"cannot make a tensor from {type(data).__name__} "
                            f"(array dtype {array.dtype})")
        if dtype is None:
            converted = default_dtype_for(array)
            if converted is not None:
                array = array.astype(converted)
    if dtype is not None:
        wanted = resolve_dtype(dtype)
        if array.dtype != wanted:
            array = array.astype(wanted)
    if device is None:
        if placed:
            return array
        kind = default_device()
        if kind == "cpu":
            return array
    else:
        kind = device_type(device)
    target = _NUMPY if kind == "cpu" else get_backend("cupy")
    if backend_for(array) is not target:
        array = target.asarray(array)
    return array


# Stand-ins for the ops_* modules (see op_refs): `_ew.add` in the class body names
# ops_elementwise.add, and the bottom of this file puts that function in its place.
_ew, _la, _rd, _sh, _misc = (OpRef(name) for name in (
    "ops_elementwise", "ops_linalg", "ops_reduce", "ops_shape", "ops_misc"))


# Every recorded node gets the next number (``_seq``): an in-place write on a recorded tensor
# tells the ops made before it from those made after (``inplace_graph``).
_node_numbers = itertools.count(1)
next_node_number = _node_numbers.__next__


class Tensor(TorchTensorMethods, TorchExtraMethods, AutogradMethods, InPlaceMethods):
    """An n-dimensional array that can record operations for reverse-mode autodiff (torch's
    further methods, such as ``size()``, ``backward()`` and the in-place ``add_``, come from the
    three bases). ``_vc`` is the version counter (``versions``), shared by aliases."""

    __slots__ = ("array", "_grad", "requires_grad", "_parents", "_backward", "_meta", "_vc",
                 "_seq", "__weakref__")
    __array_ufunc__ = None  # make NumPy defer `array op tensor` to the reflected Tensor method
    __hash__ = object.__hash__

    def __init__(self, data: Any, requires_grad: bool = False, dtype: Any = None,
                 device: Optional[str] = None, name: Optional[str] = None) -> None:
        self.array = _to_array(data, dtype, device)
        self._grad = None
        self._parents: Tuple["Tensor", ...] = ()
        self._backward: Optional[Callable] = None
        self._meta = None if name is None else {"name": name}
        self._vc = [0]
        self.requires_grad = False
        if requires_grad:
            self.requires_grad_(True)

    # ----------------------------------------------------------------- attributes
    @property
    def shape(self) -> Tuple[int, ...]:
        return self.array.shape

    @property
    def dtype(self) -> Any:
        return self.array.dtype

    @property
    def ndim(self) -> int:
        return self.array.ndim

    @property
    def device(self) -> str:
        return "cpu" if isinstance(self.array, _NUMPY.array_types) else "cuda"

    @property
    def name(self) -> Optional[str]:
        return None if self._meta is None else self._meta.get("name")

    @name.setter
    def name(self, value: Optional[str]) -> None:
        self._get_meta()["name"] = value

    def _get_meta(self) -> dict:
        if self._meta is None:
            self._meta = {}
        return self._meta

    def __len__(self) -> int:
        if self.array.ndim == 0:
            raise TypeError("len() of a 0-d tensor")
        return self.array.shape[0]

    def __repr__(self) -> str:
        body = repr(_as_numpy(self.numpy())).replace("array(", "tensor(", 1)
        extras = []
        if self.device != "cpu":
            extras.append(f"device='{self.device}'")
        if self.requires_grad:
            extras.append("requires_grad=True")
        if self.name is not None:
            extras.append(f"name={self.name!r}")
        if extras:
            body = body[:-1] + ", " + ", ".join(extras) + ")"
        return body

    # ----------------------------------------------------------------- conversions
    def item(self) -> Any:
        if self.array.size != 1:
            raise ValueError(f"item() needs a tensor with one element, got shape {self.shape}")
        return self.array.item()

    def numpy(self) -> Any:
        """The data as a NumPy array (shared with the tensor on the CPU)."""
        return backend_for(self.array).to_numpy(self.array)

    def tolist(self) -> Any:
        return self.numpy().tolist()

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        array = self.numpy()
        return array if dtype is None else array.astype(dtype)

    def __bool__(self) -> bool:
        if self.array.size != 1:
            raise ValueError(f"the truth value of a tensor of shape {self.shape} is ambiguous")
        return bool(self.array)

    def __float__(self) -> float:
        return float(self.item())

    def __int__(self) -> int:
        return int(self.item())

    def __index__(self) -> int:
        if self.array.dtype.kind not in "iu":
            raise TypeError(f"only integer tensors can be used as an index, got {self.dtype}")
        return int(self.item())

    # ----------------------------------------------------------------- operations
    # Last in the body: names such as `sum`, `max` and `float` shadow the builtins from here on.
    __add__ = __radd__ = add = _ew.add
    __sub__ = sub = _ew.sub
    __rsub__ = _ew.rsub
    __mul__ = __rmul__ = mul = _ew.mul
    __truediv__ = div = _ew.div
    __rtruediv__ = _ew.rdiv
    __pow__ = pow = _ew.pow
    __rpow__ = _ew.rpow
    __neg__ = neg = _ew.neg
    __matmul__ = matmul = _la.matmul
    __rmatmul__ = _la.rmatmul
    __lt__ = lt = _ew.lt
    __le__ = le = _ew.le
    __gt__ = gt = _ew.gt
    __ge__ = ge = _ew.ge
    __eq__ = eq = _ew.eq  # elementwise; __hash__ is set at the top, so tensors stay hashable
    __ne__ = ne = _ew.ne
    __and__, __or__, __xor__ = _ew.logical_and, _ew.logical_or, _ew.logical_xor
    __invert__ = _ew.logical_not
    exp, log, tanh, sqrt, abs = _ew.exp, _ew.log, _ew.tanh, _ew.sqrt, _ew.abs
    relu, sigmoid = _ew.relu, _ew.sigmoid
    clip = clamp = _ew.clip
    sum, mean, var, std = _rd.sum, _rd.mean, _rd.var, _rd.std
    __getitem__ = _sh.getitem
    reshape = _sh.reshape
    expand = broadcast_to = _sh.expand
    transpose, permute, swapaxes = _sh.transpose, _sh.permute, _sh.swapaxes
    unsqueeze, squeeze, flatten = _sh.unsqueeze, _sh.squeeze, _sh.flatten
    masked_fill = _sh.masked_fill
    T = property(_sh.transpose, doc="All axes reversed.")
    astype, clone = _misc.astype, _misc.clone  # `to` is TorchTensorMethods.to

    # shorthands for `to` and `astype` (ops_misc is imported at the bottom of this file)
    def cpu(self) -> "Tensor":
        return ops_misc.to(self, "cpu")

    def cuda(self) -> "Tensor":
        return ops_misc.to(self, "cuda")

    def float(self) -> "Tensor":
        return ops_misc.astype(self, "float32")

    def double(self) -> "Tensor":
        return ops_misc.astype(self, "float64")

    def long(self) -> "Tensor":
        return ops_misc.astype(self, "int64")


def _constant(data: Any) -> Tensor:
    """Wrap an op result that records no graph."""
    out = Tensor.__new__(Tensor)
    out.array = _as_numpy(data) if isinstance(data, _NUMPY_SCALAR) else data
    out._grad = None
    out.requires_grad = False
    out._parents = ()
    out._backward = None
    out._meta = None
    out._vc = [0]
    return out


def _node(data: Any, parents: Tuple[Tensor, ...], backward: Callable,
          version_counter: Optional[list] = None) -> Tensor:
    """Wrap an op result that records ``parents`` and its ``backward`` closure
    (``version_counter``: the one the closure checks, when it saves this output)."""
    out = Tensor.__new__(Tensor)
    out.array = _as_numpy(data) if isinstance(data, _NUMPY_SCALAR) else data
    out._grad = None
    out.requires_grad = True
    out._parents = parents
    out._backward = backward
    out._meta = None
    out._vc = [0] if version_counter is None else version_counter
    out._seq = next_node_number()
    return out


def make_result(data: Any, parents: Tuple[Tensor, ...], backward: Callable) -> Tensor:
    """Output of a new operation: ``backward(grad)`` must return one gradient (or None) per
    parent, as fresh arrays or views of ``grad``. Records the graph only when needed."""
    if GRAD_MODE.enabled:
        for parent in parents:
            if parent.requires_grad:
                return _node(data, parents, backward)
    return _constant(data)


# The op modules import this one, so they come last; only then can the stand-ins be resolved.
from . import ops_elementwise, ops_linalg, ops_misc, ops_reduce, ops_shape  # noqa: E402
from . import ops_gather, ops_pieces, ops_select  # noqa: E402

bind_op_refs(Tensor, (ops_elementwise, ops_linalg, ops_misc, ops_reduce, ops_shape))
bind_op_refs(TorchTensorMethods, (ops_gather, ops_pieces, ops_select))
del _ew, _la, _rd, _sh, _misc
