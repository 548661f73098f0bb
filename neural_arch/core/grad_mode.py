"""Thread-local switch that decides whether operations record the autograd graph."""
from __future__ import annotations

import functools
import threading
from typing import Any, Callable, TypeVar

F = TypeVar("F", bound=Callable[..., Any])


class _GradMode(threading.local):
    enabled = True


GRAD_MODE = _GradMode()


def is_grad_enabled() -> bool:
    """True when new operations record the graph for ``backward()``."""
    return GRAD_MODE.enabled


class set_grad_enabled:
    """Context manager / decorator that sets gradient recording to ``mode``."""

    def __init__(self, mode: bool = True) -> None:
        self.mode = bool(mode)
        self._saved: list = []

    def __enter__(self) -> None:
        self._saved.append(GRAD_MODE.enabled)
        GRAD_MODE.enabled = self.mode

    def __exit__(self, *exc_info: Any) -> None:
        GRAD_MODE.enabled = self._saved.pop()

    def __call__(self, fn: F) -> F:
        mode = self.mode

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with set_grad_enabled(mode):
                return fn(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


class no_grad(set_grad_enabled):
    """Disable graph recording inside a ``with`` block or a decorated function."""

    def __init__(self) -> None:
        super().__init__(False)


class enable_grad(set_grad_enabled):
    """Re-enable graph recording (for example inside a ``no_grad`` block)."""

    def __init__(self) -> None:
        super().__init__(True)
