"""Byte copies for the compiled broadcast (``kernels.small_broadcast``): a few bytes inline, more
as one ``memcpy``. A loop over bytes is not always vectorized: where it was not, a 64 KiB
broadcast copied at about 1.4 GB/s.

Importing this module imports Numba.
"""
from __future__ import annotations

from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

INLINE_COPY_BYTES = 256  # copies up to this size stay inline (``copy_range``)


def _bytes_array(array_type, written: bool) -> bool:
    """Whether ``array_type`` is a 1-D C-contiguous uint8 array (writable if ``written``): the
    only arrays whose bytes ``copy_bytes`` counts right (its offsets step by element)."""
    return (isinstance(array_type, types.Array) and array_type.dtype == types.uint8
            and array_type.ndim == 1 and array_type.layout == "C"
            and (array_type.mutable or not written))


@intrinsic
def copy_bytes(typingctx, dst, dst_start, src, src_start, count):  # pragma: no cover - compiled
    """``dst[dst_start:dst_start + count] = src[src_start:src_start + count]`` for byte arrays,
    as one ``memcpy`` (a loop over bytes is not always vectorized: 1.4 GB/s where it is not).
    Other arrays do not type (a TypingError where it is compiled): the count is in bytes. The
    caller keeps both ranges inside the arrays; nothing here checks them."""
    if not (_bytes_array(dst, True) and _bytes_array(src, False) and all(
            isinstance(i, types.Integer) for i in (dst_start, src_start, count))):
        return None

    def codegen(context, builder, signature, args):
        dst_type, _, src_type, _, _ = signature.args
        to = context.make_array(dst_type)(context, builder, args[0])
        src_array = context.make_array(src_type)(context, builder, args[2])
        cgutils.raw_memcpy(builder, builder.gep(to.data, [args[1]]),
                           builder.gep(src_array.data, [args[3]]), args[4], 1)
        return context.get_dummy_value()

    return types.void(dst, types.intp, src, types.intp, types.intp), codegen


@njit(cache=True, nogil=True)
def copy_range(dst, src, lo, count):  # pragma: no cover - compiled
    """``dst[lo:lo + count] = src[lo:lo + count]`` (bytes): a few in a loop LLVM unrolls, more
    by ``copy_bytes`` (a call to memcpy cost a 4-byte broadcast about 0.1 us)."""
    if count <= INLINE_COPY_BYTES:
        for i in range(lo, lo + count):
            dst[i] = src[i]
    else:
        copy_bytes(dst, lo, src, lo, count)
