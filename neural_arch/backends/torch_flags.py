"""torch's backend switches, ``torch.backends.cuda.matmul`` and ``torch.backends.cudnn``, so
that programs setting them (``torch.backends.cuda.matmul.allow_tf32 = True``) run unchanged.

The flags keep torch's names, defaults and checks (a bool each; an unknown name on ``matmul``
raises AttributeError), and nothing in the framework reads them: matrix products stay full
float32 on both devices (CuPy's cuBLAS calls do not use TF32), and no layer calls cuDNN, so
``benchmark`` and ``deterministic`` have nothing to choose between.
"""
from __future__ import annotations

from typing import Any, Dict


class BackendFlags:
    """A fixed set of boolean flags: reading or setting any other name raises AttributeError,
    and a value that is not a bool raises RuntimeError, as torch's C++ setters do."""

    def __init__(self, defaults: Dict[str, bool]) -> None:
        object.__setattr__(self, "_values", dict(defaults))

    def __getattr__(self, name: str) -> Any:
        values = object.__getattribute__(self, "_values")
        if name in values:
            return values[name]
        raise AttributeError(f"Unknown attribute {name}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"Unknown attribute {name}")
        if not isinstance(value, bool):
            raise RuntimeError(f"set {name} expects a bool, but got {type(value).__name__}")
        self._values[name] = value

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._values})"


class CuBLASFlags(BackendFlags):
    """``torch.backends.cuda.matmul``."""

    def __init__(self) -> None:
        super().__init__({"allow_tf32": False,
                          "allow_fp16_reduced_precision_reduction": True,
                          "allow_bf16_reduced_precision_reduction": True})


class CudaBackend:
    """``torch.backends.cuda``: its ``matmul`` flags, and ``is_built()``."""

    def __init__(self) -> None:
        self.matmul = CuBLASFlags()

    @staticmethod
    def is_built() -> bool:
        """True when CuPy, through which GPUs are used, is installed."""
        from . import get_backend
        return get_backend("cupy")._cupy is not None


class CudnnFlags(BackendFlags):
    """``torch.backends.cudnn``: the flags, ``is_available()`` and ``version()``."""

    def __init__(self) -> None:
        super().__init__({"enabled": True, "benchmark": False, "deterministic": False,
                          "allow_tf32": True})

    @staticmethod
    def is_available() -> bool:
        """False: no layer here calls cuDNN."""
        return False

    @staticmethod
    def version() -> None:
        return None


cuda = CudaBackend()
cudnn = CudnnFlags()

__all__ = ["BackendFlags", "CuBLASFlags", "CudaBackend", "CudnnFlags", "cuda", "cudnn"]
