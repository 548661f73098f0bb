"""Numba for the CPU kernels: compiled with ``cache=True`` when Numba is installed, else absent.

Numba is optional (the ``fast`` extra). ``compiled(fn)`` wraps a plain-Python loop kernel with
``numba.njit(cache=True, nogil=True)`` on first call and returns None when Numba is missing or
switched off with ``NEURAL_ARCH_NUMBA=0``; callers then use their NumPy form. Compilation is
lazy, so importing a kernel module costs nothing until a kernel runs.

Numba's cache stamps a kernel by its own file only. A kernel module whose machine code is also
built from other modules (a function of another kernel module inlined or called, another
module's constants frozen in, this module's njit options) names them, itself first, in a
module-level ``BUILT_FROM`` (dotted names relative to its own package, set before its first
kernel). Those files are hashed as the module is imported; before the module's first kernel
compiles, the cached machine code of all its kernels and helpers, and of the kernel modules it
names, is dropped where one of those files changed since it was cached, and their cache is left
alone by a process whose files changed after it imported them (``compiled_cache``). No kernel
of the module is usable from another thread before all of that is done.
``tests/backends/test_kernel_built_from.py`` checks the lists against the imports.

As a registry backend (``get_backend("numba")``) its arrays are NumPy arrays: the array-module
interface (``xp``, ``array_type``, ``asarray``, ``to_numpy``, ``erf``, ``gelu``, ``layer_norm``,
``softmax`` and their backwards) is the NumPy backend's, so ``backend_for`` still answers
"numpy" for them.
"""
from __future__ import annotations

import importlib
import os
import sys
import threading
from types import ModuleType
from typing import Any, Callable, Dict, List, Optional, Set

from . import compiled_cache
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
_kernels_of: Dict[str, List["_Lazy"]] = {}  # module name -> its compiled kernels (made at import)
compiled_cache.remember([__file__])  # its njit options are frozen into every kernel


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
        self.fn, self.options = fn, options
        self._made: Any = None  # the dispatcher, made under ``_lock``
        self._compiled: Any = None  # the same, once its cache is refreshed: read without a lock
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = fn.__doc__
        _kernels_of.setdefault(fn.__module__, []).append(self)
        _remember_sources(fn.__module__)

    def _dispatcher(self) -> Any:
        """The Numba dispatcher (made, not compiled); ``_lock`` held."""
        if self._made is None:
            self._made = _numba().njit(cache=True, nogil=True, **self.options)(self.fn)
        return self._made

    def __call__(self, *args: Any) -> Any:
        compiled = self._compiled
        if compiled is None:
            with _lock:
                if self._compiled is None:
                    refreshed: List[_Lazy] = []
                    _refresh_cache(sys.modules.get(self.fn.__module__), set(), refreshed)
                    # published together once every module they are built from is refreshed:
                    # other threads call ``_compiled`` without the lock
                    for kernel in [*refreshed, self]:  # self may be twice: the same code
                        kernel._compiled = kernel._dispatcher()
                compiled = self._compiled
        return compiled(*args)


def _built_from_paths(module: ModuleType) -> List[str]:
    """The files ``module``'s ``BUILT_FROM`` names (none where it has none)."""
    folder = os.path.dirname(os.path.abspath(module.__file__))
    return [os.path.join(folder, *name.split(".")) + ".py"
            for name in getattr(module, "BUILT_FROM", None) or ()]


def _remember_sources(module_name: str) -> None:
    """Hash the files the kernel module ``module_name`` is built from, as it is being imported
    (its own, and those of its ``BUILT_FROM``, imported before it): its cache is checked against
    the code this process runs (``compiled_cache.remember``)."""
    module = sys.modules.get(module_name)
    if getattr(module, "__file__", None):
        compiled_cache.remember([module.__file__, *_built_from_paths(module)])


def _refresh_cache(module: Optional[ModuleType], seen: Set[str], refreshed: List[_Lazy]) -> None:
    """Drop the cached machine code of the kernel modules ``module``'s ``BUILT_FROM`` names,
    then of ``module``'s kernels and helpers, where a file they are built from changed since it
    was cached (once per process and module: ``compiled_cache`` remembers); add the kernels of
    each module refreshed to ``refreshed``. ``_lock`` held."""
    built_from = getattr(module, "BUILT_FROM", None)
    if built_from is None or module.__name__ in seen:
        return  # a module built from its own file only: Numba's own stamp suffices
    seen.add(module.__name__)
    package = module.__package__
    for name in built_from:  # first: a kernel must not compile against a stale dependency
        _refresh_cache(sys.modules.get(f"{package}.{name}" if package else name), seen,
                       refreshed)
    # the whole module at once: its other kernels would load the same stale code later
    kernels = _kernels_of.get(module.__name__, [])
    dispatchers = [kernel._dispatcher() for kernel in kernels]
    compiled_cache.refresh_if_stale(dispatchers + compiled_cache.module_dispatchers(module),
                                    _built_from_paths(module), module.__name__)
    refreshed.extend(kernels)


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
    if numba is None:
        return fn
    _remember_sources(fn.__module__)
    return numba.njit(cache=True, nogil=True, inline="always")(fn)


def helper(fn: Optional[Callable] = None, **options: Any) -> Any:
    """``fn`` as a function of its own that ``compiled`` kernels call, compiled with its own
    ``options`` (``fastmath`` flags stay on its instructions when LLVM inlines the call, so a
    reduction may be reassociated while the caller's arithmetic is not); ``fn`` itself without
    Numba. Like ``inlined`` this imports Numba at once."""
    def wrap(f: Callable) -> Callable:
        numba = _numba()
        if numba is None:
            return f
        _remember_sources(f.__module__)
        return numba.njit(cache=True, nogil=True, **options)(f)

    return wrap(fn) if fn is not None else wrap


def reset() -> None:
    """Forget the availability check (tests flip ``NEURAL_ARCH_NUMBA`` and re-import)."""
    _state.clear()


__all__ = ["ENV_SWITCH", "array_type", "asarray", "compiled", "device", "erf", "gelu", "helper",
           "inlined", "is_available", "layer_norm", "layer_norm_backward", "name", "reset",
           "softmax", "softmax_backward", "to_numpy", "unavailable_reason", "xp"]
