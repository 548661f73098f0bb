"""bfloat16: ``ml_dtypes``' NumPy dtype, and the rules that make it behave as torch's on a CPU.

NumPy has no bfloat16; ``ml_dtypes`` (the optional extra ``neural-arch[bfloat16]``) adds one of
dtype kind ``"V"``, so ``dtypes.is_floating`` names it explicitly. NumPy then computes with it
as it promotes it, which differs from torch in three places that the ops settle here:

* a Python float meeting bfloat16 gives float32 (in ``where``, float64) in NumPy (torch keeps
  bfloat16), and so does matmul; ``round_like`` casts such a result back, which also is how
  torch's CPU kernels work (compute in float32, round once);
* bfloat16 meeting float16 has no common NumPy type (torch: float32), and meeting an integer
  array gives float64 (torch: bfloat16); ``promote_operands`` casts before the op;
* sums would accumulate in bfloat16; torch accumulates in float32 (``accumulate_dtype``).

The kernels that know float16/32/64 only (matmul, linear, layer norm, softmax, GELU, losses,
einsum) run bfloat16 in float32 and round their results (``bfloat16_compute``).

Without ``ml_dtypes`` installed, ``bfloat16`` is a stand-in that raises ``MISSING_MESSAGE``
wherever it is used as a dtype, so code that only names it (a dict of dtypes) still imports.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

MISSING_MESSAGE = ("bfloat16 needs the ml_dtypes package (NumPy has no bfloat16 of its own): "
                   "pip install 'neural-arch[bfloat16]' (or pip install ml_dtypes)")


class _MissingBfloat16:
    """``bfloat16`` when ``ml_dtypes`` is not installed: any use as a dtype raises."""

    __name__ = "bfloat16"

    @property
    def dtype(self) -> Any:  # np.dtype(obj) reads obj.dtype: the message reaches the user
        raise TypeError(MISSING_MESSAGE)

    def __repr__(self) -> str:
        return "bfloat16 (unavailable: ml_dtypes is not installed)"


try:
    import ml_dtypes
except ImportError:  # the extra is optional: only bfloat16 needs it
    ml_dtypes = None

if ml_dtypes is not None:
    bfloat16: Any = ml_dtypes.bfloat16
    BFLOAT16: Optional[np.dtype] = np.dtype(ml_dtypes.bfloat16)
else:
    bfloat16 = _MissingBfloat16()
    BFLOAT16 = None

_FLOAT32 = np.dtype(np.float32)
_FLOAT16 = np.dtype(np.float16)


def is_missing_bfloat16(dtype: Any) -> bool:
    """True for the stand-in, or the name "bfloat16", while ``ml_dtypes`` is absent."""
    return BFLOAT16 is None and (isinstance(dtype, _MissingBfloat16)
                                 or (isinstance(dtype, str) and dtype == "bfloat16"))


def _is_bfloat16_dtype(dtype: Any) -> bool:
    """For a NumPy dtype or None, on the hot paths of every op: NumPy hands out one bfloat16
    dtype object, so identity answers at once, and ``==`` (several times dearer against a
    float dtype, through NumPy's promotion machinery) is left for dtypes of bfloat16's kind,
    "V"."""
    return dtype is BFLOAT16 or (getattr(dtype, "kind", None) == "V" and dtype == BFLOAT16)


def is_bfloat16(dtype: Any) -> bool:
    if BFLOAT16 is None:
        return False
    if dtype is BFLOAT16 or isinstance(dtype, np.dtype):
        return _is_bfloat16_dtype(dtype)
    return dtype == BFLOAT16  # a scalar type or a name


def involves_bfloat16(a: Any, b: Any) -> bool:
    """Whether array (or number) ``a`` or ``b`` is bfloat16: the cheap test before the rest."""
    return BFLOAT16 is not None and (_is_bfloat16_dtype(getattr(a, "dtype", None))
                                     or _is_bfloat16_dtype(getattr(b, "dtype", None)))


def accumulate_dtype(dtype: Any) -> Optional[np.dtype]:
    """float32 for bfloat16 data (what a sum should accumulate in), else None (its own)."""
    return _FLOAT32 if is_bfloat16(dtype) else None


def round_like(out: Any, *inputs: Any) -> Any:
    """``out`` cast back to bfloat16 where the op's inputs were bfloat16 (or Python numbers, or
    integers) and NumPy answered in float32 (or float64): torch's result type, rounded once as
    its CPU kernels do."""
    dtype = getattr(out, "dtype", None)
    if BFLOAT16 is None or dtype is None or dtype.kind != "f":
        return out
    seen_bfloat16 = False
    for value in inputs:
        dtype = getattr(value, "dtype", None)
        if dtype is None or dtype.kind in "biu":
            continue  # Python numbers and integers take the floating operand's type in torch
        if not _is_bfloat16_dtype(dtype):
            return out  # a float32 (or wider) operand: float32 is torch's answer too
        seen_bfloat16 = True
    return out.astype(BFLOAT16) if seen_bfloat16 else out


def promote_operands(a: Any, b: Any) -> Tuple[Any, Any]:
    """Arrays ``a`` and ``b`` cast where NumPy cannot promote bfloat16 as torch does:
    bfloat16 with float16 become float32; an integer or bool array beside bfloat16 becomes
    bfloat16 (NumPy would answer float64)."""
    if BFLOAT16 is None:
        return a, b
    a_dtype, b_dtype = getattr(a, "dtype", None), getattr(b, "dtype", None)
    if a_dtype is None or b_dtype is None or a_dtype == b_dtype:
        return a, b
    if a_dtype == BFLOAT16:
        other, other_is_a = b_dtype, False
    elif b_dtype == BFLOAT16:
        other, other_is_a = a_dtype, True
    else:
        return a, b
    if other == _FLOAT16:
        return a.astype(_FLOAT32), b.astype(_FLOAT32)
    if other.kind in "biu":
        return (a.astype(BFLOAT16), b) if other_is_a else (a, b.astype(BFLOAT16))
    return a, b
