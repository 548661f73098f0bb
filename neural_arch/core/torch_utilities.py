"""Small torch-namespace helpers: ``numel``, ``allclose``, ``inference_mode``."""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from .grad_mode import GRAD_MODE, set_grad_enabled
from .tensor import Tensor


def numel(input: Any) -> int:
    """The number of elements of ``input``."""
    return int(input.array.size if isinstance(input, Tensor) else np.size(input))


def allclose(input: Any, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """True when ``|input - other| <= atol + rtol * |other|`` everywhere (after
    broadcasting)."""
    a = input.numpy() if isinstance(input, Tensor) else np.asarray(input)
    b = other.numpy() if isinstance(other, Tensor) else np.asarray(other)
    try:
        return bool(np.allclose(a, b, rtol=rtol, atol=atol, equal_nan=equal_nan))
    except ValueError:
        raise RuntimeError(f"allclose: shapes {a.shape} and {b.shape} do not "
                           "broadcast") from None


class inference_mode(set_grad_enabled):
    """Context manager / decorator: no graph is recorded inside (``mode=True``); with
    ``mode=False`` grad mode is left as it is, as in torch."""

    def __init__(self, mode: bool = True) -> None:
        super().__init__(False)
        self.active = bool(mode)

    def __enter__(self) -> None:
        self._saved.append(GRAD_MODE.enabled)
        if self.active:
            GRAD_MODE.enabled = False

    def __call__(self, fn: Any) -> Any:
        active = self.active

        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with inference_mode(active):
                return fn(*args, **kwargs)

        return functools.wraps(fn)(wrapper)
