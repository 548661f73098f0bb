"""Numba for the CPU kernels: compiled with ``cache=True`` when Numba is installed, else absent.

Numba is optional (the ``fast`` extra). ``compiled(fn)`` wraps a plain-Python loop kernel with
``numba.njit(cache=True, nogil=True)`` on first call and returns None when Numba is missing or
switched off with ``NEURAL_ARCH_NUMBA=0``; callers then use their NumPy form. Compilation is
lazy, so importing a kernel module costs nothing until a kernel runs.

As a registry backend (``get_backend("numba")``) its arrays are NumPy arrays: the array-module
interface (``xp``, ``array_type``, ``asarray``, ``to_numpy``, ``erf``, ``gelu``, ``layer_norm``,
``softmax`` and their backwards) is the NumPy backend's, so ``backend_for`` still answers
"numpy" for them.
"""
from __future__ import annotations

import importlib
import os
import threading
from typing import Any, Callable, Dict, Optional

from . import numpy_backend as _host

ENV_SWITCH = "NEURAL_ARCH_NUMBA"

name = "numba"
device = "cpu"
xp = _host.xp
array_type = _host.array_type
array_types = _host.array_types
asarray = _host.asarray
to_numpy = _host.to_numpy
erf = _host.erf
gelu = _host.gelu
layer_norm = _host.layer_norm
layer_norm_backward = _host.layer_norm_backward
softmax = _host.softmax
softmax_backward = _host.softmax_backward

_lock = threading.Lock()
_state: Dict[str, Any] = {}


def _numba() -> Any:
    """The numba module, or None (reason kept in ``unavailable_reason``)."""
    if "module" not in _state:
        if os.environ.get(ENV_SWITCH, "1").strip() == "0":
            _state.update(module=None, reason=f"switched off by {ENV_SWITCH}=0")
        else:
            try:
                _state.update(module=importlib.import_module("numba"), reason="")
            except ImportError as exc:
                _state.update(module=None, reason=f"Numba is not installed ({exc}); "
                              "pip install numba (the 'fast' extra) for the compiled kernels")
    return _state["module"]


def is_available() -> bool:
    """True when Numba imports and is not switched off."""
    return _numba() is not None


def unavailable_reason() -> str:
    """Why the compiled kernels are not used ('' when they are)."""
    _numba()
    return _state["reason"]


class _Lazy:
    """Compiles ``fn`` with Numba on first call (thread-safe), then calls the compiled form."""

    def __init__(self, fn: Callable, options: Dict[str, Any]) -> None:
        self.fn, self.options, self._compiled = fn, options, None
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            with _lock:
                if self._compiled is None:
                    numba = _numba()
                    self._compiled = numba.njit(cache=True, nogil=True, **self.options)(self.fn)
                compiled = self._compiled
        return compiled(*args)


def compiled(fn: Optional[Callable] = None, **options: Any) -> Any:
    """Decorator: the Numba-compiled ``fn`` (compiled on first call), or None without Numba.

    Use as ``@compiled`` or ``@compiled(fastmath=False)``; ``options`` go to ``numba.njit``.
    """
    def wrap(f: Callable) -> Optional[_Lazy]:
        return _Lazy(f, options) if is_available() else None

    return wrap(fn) if fn is not None else wrap


def inlined(fn: Callable) -> Callable:
    """``fn`` as a helper that ``compiled`` kernels can call (Numba inlines it into them, so
    the caller's fastmath flags apply); ``fn`` itself without Numba, where no kernel runs.

    Unlike ``compiled`` this imports Numba at once: use it in modules loaded on first use."""
    numba = _numba()
    return fn if numba is None else numba.njit(cache=True, nogil=True, inline="always")(fn)


def helper(fn: Optional[Callable] = None, **options: Any) -> Any:
    """``fn`` as a function of its own that ``compiled`` kernels call, compiled with its own
    ``options`` (``fastmath`` flags stay on its instructions when LLVM inlines the call, so a
    reduction may be reassociated while the caller's arithmetic is not); ``fn`` itself without
    Numba. Like ``inlined`` this imports Numba at once."""
    def wrap(f: Callable) -> Callable:
        numba = _numba()
        return f if numba is None else numba.njit(cache=True, nogil=True, **options)(f)

    return wrap(fn) if fn is not None else wrap


def reset() -> None:
    """Forget the availability check (tests flip ``NEURAL_ARCH_NUMBA`` and re-import)."""
    _state.clear()


__all__ = ["ENV_SWITCH", "array_type", "asarray", "compiled", "device", "erf", "gelu", "helper",
           "inlined", "is_available", "layer_norm", "layer_norm_backward", "name", "reset",
           "softmax", "softmax_backward", "to_numpy", "unavailable_reason", "xp"]
