"""Launching the fused CUDA kernels on CuPy arrays: compiling each source once per device, the
launch geometry, and the checks that turn an argument into the array a kernel takes.

``launch`` compiles a kernel's ``.cu`` file with ``cupy.RawModule`` on first use and keeps every
function of that file per device. The wrappers in ``cupy_kernels`` reach CuPy only through
``array_module()`` and launch only through ``launch``, so that one module holds what a GPU-less
run has to stand in for. Importing this module never needs CuPy.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Tuple

from . import cupy_backend
from .kernels import KERNELS, kernels_in, pack_args, source

THREADS = 256
_MAX_GRID_STRIDE_BLOCKS = 1 << 16
# Device tables keyed by shapes that keep changing must not pile up: a cache holds this many.
MAX_CACHED_TABLES = 16
_functions: Dict[Tuple[str, int], Any] = {}
_constants: Dict[Tuple[str, int, int], Any] = {}
_dtype_names: Dict[Any, str] = {}
_lock = threading.Lock()


def is_available() -> bool:
    """True when CuPy imports and a CUDA device answers."""
    return cupy_backend.is_available()


def array_module() -> Any:
    """CuPy, or RuntimeError saying why it cannot be used."""
    return cupy_backend.require()


def launch(name: str, grid: Tuple[int, ...], block: Tuple[int, ...], args: Tuple[Any, ...]) -> None:
    """Run kernel ``name`` from the kernel table on the current device and stream."""
    packed = pack_args(name, args)  # validates the name and the argument types first
    cp = array_module()
    key = (name, cp.cuda.Device().id)
    function = _functions.get(key)
    if function is None:
        with _lock:
            if key not in _functions:
                module = cp.RawModule(code=source(KERNELS[name].source))
                for other in kernels_in(KERNELS[name].source):
                    _functions[(other, key[1])] = module.get_function(other)
            function = _functions[key]
    function(grid, block, packed)


def dtype_name(dtype: Any) -> str:
    """``dtype.name``, remembered: NumPy computes the name in Python, microseconds a call, and a
    multi-tensor launch checks four arrays per tensor."""
    name = _dtype_names.get(dtype)
    if name is None:
        name = _dtype_names[dtype] = dtype.name
    return name


def device_array(op: str, what: str, array: Any, dtypes: Tuple[str, ...] = ("float32",),
                 contiguous: bool = False) -> Any:
    """``array`` as a C-contiguous CuPy array (copied if needed, unless ``contiguous`` demands
    it already is because the kernel writes into it)."""
    cp = array_module()
    if not isinstance(array, cp.ndarray):
        raise TypeError(f"{op}: {what} must be a CuPy array, got {type(array).__name__}")
    if dtype_name(array.dtype) not in dtypes:
        raise TypeError(f"{op}: {what} has dtype {array.dtype}; this kernel takes {dtypes}")
    # CuPy's public flags build an object per read (~0.5 us); its _c_contiguous field is the
    # same bit, and a multi-tensor launch reads it for four arrays per tensor
    c_contiguous = getattr(array, "_c_contiguous", None)
    if c_contiguous if c_contiguous is not None else array.flags.c_contiguous:
        return array
    if contiguous:
        raise ValueError(f"{op}: {what} (shape {array.shape}, strides {array.strides}) is "
                         "updated in place and must be C-contiguous")
    return cp.ascontiguousarray(array)


def filled(value: float, size: int) -> Any:
    """A cached read-only-by-convention float32 vector of ``size`` copies of ``value``."""
    cp = array_module()
    key = (str(value), size, cp.cuda.Device().id)
    array = _constants.get(key)
    if array is None:
        if len(_constants) >= MAX_CACHED_TABLES:  # shapes that keep changing must not pile up
            _constants.clear()
        array = _constants[key] = cp.full(size, value, dtype=cp.float32)
    return array


def grid_stride_blocks(n: int) -> int:
    """Blocks of ``THREADS`` for a grid-stride loop over ``n`` elements (capped)."""
    return max(1, min(-(-n // THREADS), _MAX_GRID_STRIDE_BLOCKS))


def row_threads(width: int) -> int:
    """Threads per row block: enough warps to cover ``width`` up to 256, at least one warp."""
    return min(THREADS, max(32, -(-width // 32) * 32))


def int32_arg(op: str, what: str, value: int) -> int:
    """``value`` for a kernel's int32 parameter, or ValueError when it does not fit."""
    if value > 2 ** 31 - 1:
        raise ValueError(f"{op}: {what} = {value} exceeds the kernels' int32 range")
    return value
