"""From user tensors to the flat contiguous NumPy buffers the algorithms work on, and back."""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .reduce_ops import SUPPORTED_DTYPES, ReduceOp, check_dtype_for_op

_SUPPORTED_NAMES = [np.dtype(d).name for d in SUPPORTED_DTYPES]
_ACCEPTED: set = set()  # (dtype, reduce op or None) pairs already checked: a set lookup per call


def _on_device(obj: Any) -> bool:
    return type(obj).__module__.split(".", 1)[0] == "cupy"


class HostStaged(np.ndarray):
    """A host copy of a CuPy array, in pinned memory: collectives run on it like on any NumPy
    array, and every ``staged[...] = value`` also copies the whole result back to the device
    (``Flat.commit`` and the output lists of the gathers write this way). Views of it are plain
    host arrays that do not write back."""

    device_array: Any = None

    def __array_finalize__(self, obj: Any) -> None:
        self.device_array = None

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        device = self.device_array
        if device is not None:
            cupy = __import__("cupy")
            with device.device:
                if device.flags.c_contiguous:
                    device.set(self.view(np.ndarray))
                else:
                    device[...] = cupy.asarray(self.view(np.ndarray))
                cupy.cuda.get_current_stream().synchronize()  # the pinned copy may be reused


def stage_on_host(device_array: Any) -> HostStaged:
    """Copy a CuPy array into pinned host memory (ordinary memory if pinning fails)."""
    cupy = __import__("cupy")
    with device_array.device:
        try:
            memory = cupy.cuda.alloc_pinned_memory(max(device_array.nbytes, 1))
            host = np.frombuffer(memory, device_array.dtype, device_array.size)
        except Exception:  # pinned memory exhausted or unavailable: a pageable buffer works too
            host = np.empty(device_array.size, device_array.dtype)
        host = host.reshape(device_array.shape)
        cupy.ascontiguousarray(device_array).get(out=host)
    staged = host.view(HostStaged)
    staged.device_array = device_array
    return staged


def copy_into_host(view: np.ndarray, array: Any) -> None:
    """Copy ``array`` (NumPy or CuPy) into the flat host buffer ``view``. A device array goes
    from the GPU straight into ``view`` (a DDP bucket, maybe shared memory), with no temporary."""
    flat = array.reshape(-1)
    if not _on_device(array):
        view[...] = flat
    elif flat.dtype == view.dtype and view.flags.c_contiguous:
        with array.device:
            flat.get(out=view)
    else:
        with array.device:
            view[...] = flat.get()


def copy_from_host(host: np.ndarray, like: Any, out: Optional[Any] = None) -> Any:
    """``host`` copied into ``out`` (NumPy or CuPy), or, without ``out``, into a new array on
    ``like``'s side (host or ``like``'s GPU)."""
    target = like if out is None else out
    if not _on_device(target):
        if out is None:
            return host.copy()
        out[...] = host
        return out
    cupy = __import__("cupy")
    with target.device:
        if out is None:
            return cupy.asarray(host)
        out[...] = cupy.asarray(host)
    return out


def array_of(tensor: Any, what: str = "tensor") -> np.ndarray:
    """The NumPy array behind a ``Tensor`` (its ``.array``) or an array; TypeError otherwise.
    CuPy arrays (bare or in a Tensor) come back as a ``HostStaged`` host copy."""
    if type(tensor) is np.ndarray:  # the common case, checked first: it runs on every call
        return tensor
    if _on_device(tensor):
        return stage_on_host(tensor)
    data = tensor if isinstance(tensor, np.ndarray) else getattr(tensor, "array", None)
    if _on_device(data):
        return stage_on_host(data)
    if not isinstance(data, np.ndarray):
        inner = "" if data is None else f" holding {type(data).__module__}.{type(data).__name__}"
        raise TypeError(f"{what} must be a NumPy or CuPy array or a Tensor holding one, got "
                        f"{type(tensor).__name__}{inner}")
    return data


def checked_array(tensor: Any, what: str = "tensor", op: Optional[ReduceOp] = None,
                  writable: bool = False) -> np.ndarray:
    """``array_of`` plus the dtype (and reduce-op) checks every public collective makes."""
    arr = array_of(tensor, what)
    if (arr.dtype, op) not in _ACCEPTED:
        if arr.dtype.type not in SUPPORTED_DTYPES:
            raise TypeError(f"{what} has dtype {arr.dtype}, which collectives do not support; "
                            f"use one of {_SUPPORTED_NAMES}")
        if op is not None:
            check_dtype_for_op(arr.dtype, op)
        _ACCEPTED.add((arr.dtype, op))
    if writable and not arr.flags.writeable:
        raise ValueError(f"{what} (shape {arr.shape}, dtype {arr.dtype}) is read-only but the "
                         "collective writes into it")
    return arr


def same_layout(arr: np.ndarray, ref: np.ndarray, what: str) -> None:
    if arr.dtype != ref.dtype:
        raise TypeError(f"{what} has dtype {arr.dtype} but the input tensor has {ref.dtype}")
    if arr.size != ref.size:
        raise ValueError(f"{what} has shape {arr.shape} ({arr.size} elements) but the input "
                         f"tensor has shape {ref.shape} ({ref.size} elements)")


class Flat:
    """A 1-D C-contiguous view of ``arr``; a staged copy when ``arr`` is not contiguous.

    After writing into ``.buf``, call ``commit()`` to copy a staged buffer back into ``arr``.
    """

    __slots__ = ("arr", "buf", "staged")

    def __init__(self, arr: np.ndarray) -> None:
        self.arr = arr
        self.staged = not arr.flags.c_contiguous or isinstance(arr, HostStaged)
        if self.staged:
            self.buf = np.ascontiguousarray(arr).reshape(-1)
        else:
            self.buf = arr if arr.ndim == 1 else arr.reshape(-1)

    def commit(self) -> None:
        if self.staged:
            self.arr[...] = self.buf.reshape(self.arr.shape)


def wrap_like(template: Any, arr: np.ndarray) -> Any:
    """``arr`` as the same kind of object as ``template`` (array, or Tensor-like), on the
    template's device."""
    if isinstance(template, np.ndarray):
        return arr
    if _on_device(template):
        return __import__("cupy").asarray(arr)
    if _on_device(getattr(template, "array", None)):
        return type(template)(__import__("cupy").asarray(arr))
    return type(template)(arr)


def as_list(items: Any, what: str) -> list:
    if not isinstance(items, (list, tuple)):
        raise TypeError(f"{what} must be a list of tensors, got {type(items).__name__}")
    return list(items)
