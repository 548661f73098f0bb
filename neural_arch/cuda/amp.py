"""``torch.cuda.amp.GradScaler`` and ``torch.cuda.amp.autocast``: torch's deprecated spellings
of ``torch.amp.GradScaler("cuda", ...)`` and ``torch.amp.autocast("cuda", ...)``.

As torch, each warns that the spelling is deprecated (FutureWarning) and then is the
``neural_arch.amp`` class for device "cuda": without a CUDA device (no CuPy, or no GPU) the
scaler and the autocast region are disabled with a warning, as on torch's CPU build, and a
program written for a GPU runs unchanged on the CPU.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from .. import amp as _amp


class GradScaler(_amp.GradScaler):
    """``neural_arch.amp.GradScaler("cuda", ...)`` under its old name."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000,
                 enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.GradScaler(args...)` is deprecated. Please use "
                      "`torch.amp.GradScaler('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


class autocast(_amp.autocast):
    """``neural_arch.amp.autocast("cuda", ...)`` under its old name; torch's signature."""

    def __init__(self, enabled: bool = True, dtype: Any = np.float16,
                 cache_enabled: bool = True) -> None:
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated. Please use "
                      "`torch.amp.autocast('cuda', args...)` instead.", FutureWarning,
                      stacklevel=2)
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


__all__ = ["GradScaler", "autocast"]
