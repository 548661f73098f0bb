"""Array-module registry: which array library (and device) holds a tensor's data.

A backend module exposes ``name``, ``device``, ``xp`` (the array namespace), ``array_type``,
``asarray(data, dtype=None)``, ``to_numpy(array)`` and ``erf(array)``. Backends are imported
lazily so that a missing optional library (CuPy) only matters when it is asked for.
"""
from __future__ import annotations

import importlib
from types import ModuleType
from typing import Any, Dict

_MODULES: Dict[str, str] = {
    "numpy": "neural_arch.backends.numpy_backend",
    "cupy": "neural_arch.backends.cupy_backend",
}
_DEVICE_TO_BACKEND = {"cpu": "numpy", "cuda": "cupy", "gpu": "cupy"}
_loaded: Dict[str, ModuleType] = {}


def available_backends() -> list:
    """Names of every registered backend (whether or not its library is installed)."""
    return sorted(_MODULES)


def get_backend(name: str) -> ModuleType:
    """Return the backend module registered as ``name`` ("numpy" or "cupy")."""
    module = _loaded.get(name)
    if module is None:
        if name not in _MODULES:
            raise ValueError(f"unknown backend {name!r}; registered backends: "
                             f"{available_backends()}")
        module = importlib.import_module(_MODULES[name])
        _loaded[name] = module
    return module


def device_type(device: Any) -> str:
    """Normalise a device spec ("cpu", "cuda", "cuda:0", None) to "cpu" or "cuda"."""
    if device is None:
        return "cpu"
    text = str(device).lower()
    kind = text.split(":", 1)[0]
    if kind not in _DEVICE_TO_BACKEND:
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda[:index]'")
    return "cpu" if kind == "cpu" else "cuda"


def backend_for(obj: Any) -> ModuleType:
    """The backend of an array, a tensor, or a device string."""
    if isinstance(obj, str):
        return get_backend(_DEVICE_TO_BACKEND[device_type(obj)])
    data = getattr(obj, "data", obj) if hasattr(obj, "requires_grad") else obj
    numpy_backend = get_backend("numpy")
    if isinstance(data, numpy_backend.array_types):
        return numpy_backend
    if type(data).__module__.split(".", 1)[0] == "cupy":
        return get_backend("cupy")
    return numpy_backend


def xp_of(array: Any) -> ModuleType:
    """The array namespace (``numpy`` or ``cupy``) that holds ``array``."""
    if type(array) is _NUMPY.array_type:
        return _NUMPY.xp
    return backend_for(array).xp


_NUMPY = get_backend("numpy")

__all__ = ["available_backends", "get_backend", "backend_for", "device_type", "xp_of"]
