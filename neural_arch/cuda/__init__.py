"""``torch.cuda`` for ``import neural_arch as torch``: whether GPUs can be used and which one.

GPUs are reached through CuPy (``device="cuda"``), so every answer here comes from the CuPy
backend (``neural_arch.backends.cupy_backend``), and CuPy is imported only when a function is
called. Without CuPy or without a device, ``is_available()`` is False and ``device_count()`` 0,
as torch answers on a machine without CUDA; the calls that need a device (``current_device``,
``set_device``, ``synchronize``, ``get_device_name``) then raise RuntimeError saying why.
"""
from __future__ import annotations

from typing import Any

from ..backends import get_backend
from . import amp

_NO_DEVICE = "CUDA is not available: "


def is_available() -> bool:
    """True when CuPy imports and at least one CUDA device answers."""
    return get_backend("cupy").is_available()


def _cupy(op: str) -> Any:
    backend = get_backend("cupy")
    if not backend.is_available():
        raise RuntimeError(f"torch.cuda.{op}(): {_NO_DEVICE}{backend._unavailable_reason()}")
    return backend.require()


def device_count() -> int:
    """The number of CUDA devices; 0 without CuPy or without a device."""
    if not is_available():
        return 0
    return int(get_backend("cupy").require().cuda.runtime.getDeviceCount())


def current_device() -> int:
    """The index of the device that new CUDA arrays land on."""
    return int(_cupy("current_device").cuda.runtime.getDevice())


def _index(device: Any, op: str) -> int:
    """A device index from None (the current one), an int, "cuda", "cuda:N" or a ``device``."""
    if device is None:
        return current_device()
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    kind, _, index = str(device).partition(":")
    if kind != "cuda":
        raise ValueError(f"Expected a cuda device, but got: {device}")
    if not index:
        return current_device()
    if not index.isdigit():
        raise ValueError(f"torch.cuda.{op}(): {device!r} is not a device; expected 'cuda:N'")
    return int(index)


def _checked_index(device: Any, op: str) -> int:
    index = _index(device, op)
    count = device_count()
    if not 0 <= index < count:
        raise ValueError(f"torch.cuda.{op}(): device cuda:{index} does not exist; there are "
                         f"{count} CUDA devices")
    return index


def set_device(device: Any) -> None:
    """Make ``device`` the current one (where CuPy puts new arrays); a negative index does
    nothing, as in torch."""
    index = _index(device, "set_device")
    if index < 0:
        return
    cupy = _cupy("set_device")
    cupy.cuda.Device(_checked_index(index, "set_device")).use()


def synchronize(device: Any = None) -> None:
    """Wait for all work queued on ``device`` (default: the current one) to finish."""
    cupy = _cupy("synchronize")
    cupy.cuda.Device(_checked_index(device, "synchronize")).synchronize()


def get_device_name(device: Any = None) -> str:
    """The device's name as the driver reports it, e.g. "NVIDIA H200"."""
    cupy = _cupy("get_device_name")
    name = cupy.cuda.runtime.getDeviceProperties(_checked_index(device, "get_device_name"))["name"]
    return name.decode() if isinstance(name, bytes) else str(name)


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """False: GPU tensors cannot hold bfloat16 here (CuPy arrays have no such dtype; CPU
    tensors can, through ml_dtypes)."""
    return False


def _seed(seed: Any, op: str) -> None:
    if seed is None or isinstance(seed, (list, tuple, dict)):
        raise TypeError(f"torch.cuda.{op}(): seed must be an integer, got {seed!r}")
    int(seed)  # torch converts with int(): "7" and 7.0 pass, "seven" raises ValueError


def manual_seed(seed: Any) -> None:
    """Checks ``seed``; nothing else to do: the random numbers of CUDA tensors are drawn from
    the one generator that ``neural_arch.manual_seed`` seeds, for every device."""
    _seed(seed, "manual_seed")


def manual_seed_all(seed: Any) -> None:
    """As ``manual_seed``: one generator serves every device."""
    _seed(seed, "manual_seed_all")


__all__ = ["amp", "current_device", "device_count", "get_device_name", "is_available",
           "is_bf16_supported", "manual_seed", "manual_seed_all", "set_device", "synchronize"]
