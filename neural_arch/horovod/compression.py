"""Reduce operations and gradient compression, under Horovod's names.

``Compression.fp16`` sends floating tensors as float16 (half the bytes on the wire) and casts
the result back to the tensor's dtype; other dtypes pass unchanged. The sum itself runs in
float16, so values that overflow float16 (above 65504) become inf: prescale them down first.
"""
from __future__ import annotations

from typing import Any, Tuple

import numpy as np


class ReduceOp:
    """``hvd.Average``, ``hvd.Sum``, ``hvd.Adasum``: compared by identity, printed by name."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"hvd.{self.name}"


Average, Sum, Adasum = ReduceOp("Average"), ReduceOp("Sum"), ReduceOp("Adasum")
_OPS = (Average, Sum, Adasum)


def resolve_op(op: Any, average: Any = None, what: str = "allreduce") -> ReduceOp:
    """Horovod's rules: ``op`` supersedes the deprecated ``average`` flag; Average by default."""
    if op is not None and average is not None:
        raise ValueError(f"hvd.{what}: the op parameter supersedes average; pass only one of "
                         f"them (got op={op!r}, average={average!r})")
    if op is None:
        op = Average if average is None or average else Sum
    if op not in _OPS:
        raise ValueError(f"hvd.{what}: op must be hvd.Average, hvd.Sum or hvd.Adasum, got {op!r}")
    if op is Adasum:
        raise NotImplementedError(f"hvd.{what}(op=hvd.Adasum): the Adasum reduction is not "
                                  "supported; use hvd.Average or hvd.Sum")
    return op


class NoneCompressor:
    """Send the tensor as it is."""

    @staticmethod
    def wire_dtype(dtype: np.dtype) -> np.dtype:
        return np.dtype(dtype)

    @staticmethod
    def compress(arr: np.ndarray) -> Tuple[np.ndarray, Any]:
        return arr, None

    @staticmethod
    def decompress(arr: np.ndarray, ctx: Any) -> np.ndarray:
        return arr


class FP16Compressor:
    """Send floating tensors as float16; cast the result back to the original dtype."""

    @staticmethod
    def wire_dtype(dtype: np.dtype) -> np.dtype:
        dtype = np.dtype(dtype)
        return np.dtype(np.float16) if dtype.kind == "f" else dtype

    @staticmethod
    def compress(arr: np.ndarray) -> Tuple[np.ndarray, Any]:
        if arr.dtype.kind == "f" and arr.dtype != np.float16:
            return arr.astype(np.float16), arr.dtype
        return arr, None

    @staticmethod
    def decompress(arr: np.ndarray, ctx: Any) -> np.ndarray:
        return arr if ctx is None else arr.astype(ctx)


class Compression:
    """``hvd.Compression.none`` and ``hvd.Compression.fp16``."""

    none = NoneCompressor
    fp16 = FP16Compressor


def check_compression(compression: Any, what: str) -> Any:
    if not all(callable(getattr(compression, name, None))
               for name in ("compress", "decompress", "wire_dtype")):
        raise TypeError(f"{what}: compression must be hvd.Compression.none, "
                        f"hvd.Compression.fp16 or a class with compress/decompress/wire_dtype, "
                        f"got {compression!r}")
    return compression
