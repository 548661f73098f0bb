"""``autocast``: torch's context manager and decorator for mixed-precision regions.

The state lives in ``core.autocast_state`` (per thread, per device type) so the ops can read
it; this module only enters and leaves regions.
"""
from __future__ import annotations

import functools
import warnings
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from ..core.autocast_state import (DEFAULT_DTYPES, check_device_type, get_autocast_dtype,
                                   is_autocast_enabled, set_autocast_state)
from ..backends import get_backend
from ..core.bfloat16 import BFLOAT16
from ..core.dtypes import resolve_dtype

# torch's defaults: bfloat16 on CPU (float16 without ml_dtypes, see core.bfloat16), float16 on
# CUDA; CuPy arrays cannot hold bfloat16, so a CUDA region asking for it disables itself
_SUPPORTED_DTYPES = tuple(np.dtype(t) for t in (np.float16, BFLOAT16) if t is not None)


class autocast:
    """``with autocast("cpu"):`` runs matmul, linear and the convolutions in bfloat16 (float16
    on CUDA, or as ``dtype`` says) and the losses in float32 (see ``core.autocast_state`` for
    the lists); ``@autocast("cpu")`` does the same around each call of a function. Regions
    nest, and leaving one (also through an exception) restores the state it found.
    ``cache_enabled`` is accepted for torch's signature; casts are not cached, which changes
    speed, never results. As torch's, ``autocast("cuda")`` where CUDA is not available, or
    with bfloat16, which the GPU arrays cannot hold, warns and disables itself."""

    def __init__(self, device_type: str, dtype: Optional[Any] = None, enabled: bool = True,
                 cache_enabled: Optional[bool] = None) -> None:
        self.device = check_device_type(device_type)
        self.fast_dtype = (DEFAULT_DTYPES[self.device] if dtype is None
                           else resolve_dtype(dtype))
        if self.fast_dtype not in _SUPPORTED_DTYPES:
            names = " or ".join(str(t) for t in _SUPPORTED_DTYPES)
            raise ValueError(f"autocast dtype must be {names}, got {self.fast_dtype} for "
                             f"device_type {self.device!r}")
        if not isinstance(enabled, bool):
            raise TypeError(f"autocast enabled must be a bool, got {type(enabled).__name__}")
        if enabled and self.device == "cuda" and not get_backend("cupy").is_available():
            warnings.warn("autocast: device_type 'cuda', but CUDA is not available (no CuPy or "
                          "no device). Disabling autocast.", UserWarning, stacklevel=2)
            enabled = False
        if enabled and self.device == "cuda" and self.fast_dtype == BFLOAT16:
            warnings.warn("In CUDA autocast, but the target dtype bfloat16 is not supported "
                          "(CuPy arrays cannot hold it). Disabling autocast.", UserWarning,
                          stacklevel=2)
            enabled = False
        self._enabled = enabled
        self._cache_enabled = cache_enabled
        self._saved: List[Tuple[bool, np.dtype]] = []  # one entry per region this object is in

    def __enter__(self) -> "autocast":
        self._saved.append(set_autocast_state(self.device, self._enabled, self.fast_dtype))
        return self

    def __exit__(self, *exc_info: Any) -> bool:
        enabled, dtype = self._saved.pop()
        set_autocast_state(self.device, enabled, dtype)
        return False

    def __call__(self, func: Callable) -> Callable:
        @functools.wraps(func)
        def with_autocast(*args: Any, **kwargs: Any) -> Any:
            with self:
                return func(*args, **kwargs)
        return with_autocast

    def __repr__(self) -> str:
        return (f"autocast(device_type={self.device!r}, dtype={self.fast_dtype}, "
                f"enabled={self._enabled})")


__all__ = ["autocast", "is_autocast_enabled", "get_autocast_dtype"]
