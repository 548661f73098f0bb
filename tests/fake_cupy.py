"""A stand-in for the CuPy calls that host staging and the NCCL transport make, on NumPy.

Its arrays report the module name ``cupy`` (which is how the framework recognises device
arrays), keep their data in a private NumPy array the code under test cannot see except
through ``get``/``set``/``[...] =``, and count those transfers; ``array.data.ptr`` is the
address of that host memory, which ``fake_nccl`` reads and writes. ``install()`` puts this
module (and ``fake_nccl`` as ``cupy.cuda.nccl``) in ``sys.modules``; use it only in child
processes or under ``monkeypatch``.
"""
from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np

transfers = {"to_host": 0, "to_device": 0}


class _Device:
    def __init__(self, index: int = 0) -> None:
        self.id = index

    def use(self) -> None:
        return None

    def __enter__(self) -> "_Device":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None


class _Pointer:
    def __init__(self, ptr: int) -> None:
        self.ptr = ptr


class ndarray:  # noqa: N801 - the CuPy name
    __module__ = "cupy"  # how the framework tells device arrays from host ones

    def __init__(self, host: np.ndarray, copy: bool = True) -> None:
        self._host = np.array(host) if copy else host

    shape = property(lambda self: self._host.shape)
    dtype = property(lambda self: self._host.dtype)
    size = property(lambda self: self._host.size)
    nbytes = property(lambda self: self._host.nbytes)
    ndim = property(lambda self: self._host.ndim)
    flags = property(lambda self: self._host.flags)
    strides = property(lambda self: self._host.strides)
    device = property(lambda self: _Device())
    data = property(lambda self: _Pointer(self._host.ctypes.data))

    @property
    def __cuda_array_interface__(self) -> dict:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3,
                "data": (self._host.ctypes.data, False)}

    def get(self, stream: Any = None, out: Any = None) -> np.ndarray:
        transfers["to_host"] += 1
        if out is None:
            return self._host.copy()
        assert out.shape == self.shape and out.dtype == self.dtype and out.flags.c_contiguous
        out[...] = self._host
        return out

    def set(self, arr: np.ndarray, stream: Any = None) -> None:
        assert arr.shape == self.shape and arr.dtype == self.dtype and self.flags.c_contiguous
        transfers["to_device"] += 1
        self._host[...] = arr

    def __getitem__(self, key: Any) -> "ndarray":
        return ndarray(self._host[key], copy=False)

    def __setitem__(self, key: Any, value: Any) -> None:
        transfers["to_device"] += 1
        self._host[key] = value._host if isinstance(value, ndarray) else value

    def reshape(self, *shape: Any) -> "ndarray":
        return ndarray(self._host.reshape(*shape), copy=False)

    def copy(self) -> "ndarray":
        return ndarray(self._host)

    def view(self, dtype: Any) -> "ndarray":
        return ndarray(self._host.view(dtype), copy=False)

    def __itruediv__(self, other: Any) -> "ndarray":
        self._host /= other
        return self


def asarray(value: Any, dtype: Any = None) -> ndarray:
    if isinstance(value, ndarray):
        return value if dtype is None or value.dtype == dtype else ndarray(
            value._host.astype(dtype))
    return ndarray(np.asarray(value, dtype=dtype))


def ascontiguousarray(value: ndarray) -> ndarray:
    return ndarray(np.ascontiguousarray(value._host), copy=False)


def asnumpy(value: ndarray) -> np.ndarray:
    return value._host.copy()


def empty(shape: Any, dtype: Any = np.float64) -> ndarray:
    return ndarray(np.empty(shape, dtype=dtype), copy=False)


uint8, float16, float32, float64, int32, int64 = (np.uint8, np.float16, np.float32, np.float64,
                                                  np.int32, np.int64)
visible_devices = 2  # what cuda.runtime.getDeviceCount() answers


class _Stream:
    """Work on the fake device runs at once, so a stream is always done."""

    ptr = 0
    done = True

    def __init__(self, non_blocking: bool = False) -> None:
        self.non_blocking = non_blocking

    def synchronize(self) -> None:
        return None


cuda = types.ModuleType("cupy.cuda")
cuda.alloc_pinned_memory = lambda nbytes: bytearray(nbytes)
cuda.get_current_stream = lambda: _Stream()
cuda.Stream = _Stream
cuda.Device = _Device
cuda.runtime = types.SimpleNamespace(getDeviceCount=lambda: visible_devices)


def install() -> types.ModuleType:
    """This module as ``cupy`` (and ``fake_nccl`` as ``cupy.cuda.nccl``) for the process."""
    import fake_nccl
    module = sys.modules[__name__]
    cuda.nccl = fake_nccl
    sys.modules.update({"cupy": module, "cupy.cuda": cuda, "cupy.cuda.nccl": fake_nccl})
    return module
