"""Array-module registry: which array library (and device) holds a tensor's data.

A backend module exposes ``name``, ``device``, ``xp`` (the array namespace), ``array_type``,
``asarray(data, dtype=None)``, ``to_numpy(array)``, ``erf(array)``, ``gelu(array,
with_derivative)`` (exact GELU, and its derivative for the backward), and LayerNorm and softmax
over the last axis with their backwards (``layer_norm``, ``layer_norm_backward``, ``softmax``,
``softmax_backward``; see ``row_ops``). Backends are imported lazily so that a missing optional
library (CuPy) only matters when it is asked for.

The default device of new tensors is ``set_default_device(...)`` if set, else the environment
variable ``NEURAL_ARCH_DEVICE`` (read on every call), else "cpu".
"""
from __future__ import annotations

import importlib
import os
from types import ModuleType
from typing import Any, Dict, Optional

from .._environ import raw_reader

_MODULES: Dict[str, str] = {
    "numpy": "neural_arch.backends.numpy_backend",
    "cupy": "neural_arch.backends.cupy_backend",
    "numba": "neural_arch.backends.numba_backend",
}
_DEVICE_TO_BACKEND = {"cpu": "numpy", "cuda": "cupy", "gpu": "cupy"}
_loaded: Dict[str, ModuleType] = {}


def available_backends() -> list:
    """Names of every registered backend (whether or not its library is installed)."""
    return sorted(_MODULES)


def get_backend(name: str) -> ModuleType:
    """Return the backend module registered as ``name`` ("numpy", "cupy" or "numba")."""
    module = _loaded.get(name)
    if module is None:
        if name not in _MODULES:
            raise ValueError(f"unknown backend {name!r}; registered backends: "
                             f"{available_backends()}")
        module = importlib.import_module(_MODULES[name])
        _loaded[name] = module
    return module


def device_type(device: Any) -> str:
    """Normalise a device spec ("cpu", "cuda", "cuda:0", None) to "cpu" or "cuda".

    An int N is "cuda:N", as in torch (``t.to(0)``, ``model.to(local_rank)``)."""
    if device is None:
        return "cpu"
    if isinstance(device, int) and not isinstance(device, bool):
        if device < 0:
            raise ValueError(f"device index must be >= 0, got {device}")
        return "cuda"
    text = str(device).lower()
    kind = text.split(":", 1)[0]
    if kind not in _DEVICE_TO_BACKEND:
        raise ValueError(f"unknown device {device!r}; expected 'cpu' or 'cuda[:index]'")
    return "cpu" if kind == "cpu" else "cuda"


def backend_for(obj: Any) -> ModuleType:
    """The backend of an array, a tensor, or a device string."""
    if isinstance(obj, str):
        return get_backend(_DEVICE_TO_BACKEND[device_type(obj)])
    data = getattr(obj, "array", obj) if hasattr(obj, "requires_grad") else obj
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


ENV_DEVICE = "NEURAL_ARCH_DEVICE"
_ACCEPTED = "'cpu', 'cuda', 'cuda:N' or 'gpu'"
_read_env_device = raw_reader(ENV_DEVICE)  # every Tensor(ndarray) asks: ~20 ns a read
_override: Optional[str] = None
_parsed: Dict[Any, str] = {None: "cpu"}  # raw environment value -> "cpu" / "cuda"


def _parse(value: Any, source: str) -> str:
    text = str(value).strip().lower()
    kind, _, index = text.partition(":")
    if kind in _DEVICE_TO_BACKEND and (not index or index.isdigit()):
        return device_type(kind)
    raise ValueError(f"{source}={value!r} is not a device; expected {_ACCEPTED}")


def default_device() -> str:
    """The device ("cpu" or "cuda") that new tensors from host data land on."""
    if _override is not None:
        return _override
    raw = _read_env_device()
    device = _parsed.get(raw)
    if device is None:
        value = os.environ.get(ENV_DEVICE, "")
        device = _parse(value, ENV_DEVICE) if value.strip() else "cpu"
        _parsed[raw] = device
    return device


def set_default_device(device: Optional[str]) -> None:
    """Make ``device`` ("cpu", "cuda", "cuda:N", "gpu") the default for new tensors, ahead of
    ``NEURAL_ARCH_DEVICE``; ``None`` goes back to the environment variable (or "cpu").

    As everywhere in the framework, a CUDA index is accepted but arrays go to CuPy's current
    device (select it with ``cupy.cuda.Device(N).use()``)."""
    global _override
    _override = None if device is None else _parse(device, "set_default_device: device")


_NUMPY = get_backend("numpy")

__all__ = ["ENV_DEVICE", "available_backends", "backend_for", "default_device", "device_type",
           "get_backend", "set_default_device", "xp_of"]

# torch's names under ``torch.backends`` (``cuda.matmul.allow_tf32``, ``cudnn.benchmark``: flags
# that nothing here reads) and torch's thread-count functions
from .threads import get_num_threads, set_num_threads  # noqa: E402
from .torch_flags import cuda, cudnn  # noqa: E402

__all__ += ["cuda", "cudnn", "get_num_threads", "set_num_threads"]
