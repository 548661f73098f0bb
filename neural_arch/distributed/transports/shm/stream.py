"""A copy with streaming (non-temporal) stores: the written lines go to memory, not the cache.

Why a shared-memory transport wants one: a rank that rewrites the workspace area its peer read
last round must first take those cache lines back from the peer's cache. Where the two cores
sit on different core complexes (chiplets), or a virtual machine's cores do, that takes so long
that a 1 MiB copy into the area was seen at 415-498 us instead of 61-76 us. Streaming stores
skip the read-for-ownership; the data goes out in whole lines while the peer's copies are
dropped: 61-83 us there (``benchmarks/bench_shm_copies.py``). While the cores share a cache
they are slower (95-110 us) and the peer then reads the data from memory instead of from a
cache, so callers choose them only when plain copies are measured to be slow
(``writer``).

NumPy has no such copy, so this module builds one from LLVM through Numba: 32-byte vector loads
and stores marked ``!nontemporal`` (``vmovntps`` on x86-64), then a full fence, because
streaming stores are not ordered with later ordinary stores and a peer must see the data
before it sees the counter that says the data is there. Importing this module imports
Numba; ``numba_backend.is_available()`` says whether it can be used.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

BLOCK_BYTES = 32  # one AVX vector; the stores need destinations aligned to it


@intrinsic
def _stream_blocks(typingctx, dst_address, src_address, blocks):  # pragma: no cover - compiled
    signature = types.void(types.intp, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        dst_int, src_int, count = args
        vector = ir.VectorType(ir.IntType(64), BLOCK_BYTES // 8)
        dst = builder.inttoptr(dst_int, vector.as_pointer())
        src = builder.inttoptr(src_int, vector.as_pointer())
        nontemporal = builder.module.add_metadata([ir.Constant(ir.IntType(32), 1)])
        with cgutils.for_range(builder, count) as loop:
            value = builder.load(builder.gep(src, [loop.index]), align=1)
            store = builder.store(value, builder.gep(dst, [loop.index]), align=BLOCK_BYTES)
            store.set_metadata("nontemporal", nontemporal)
        builder.fence("seq_cst")
        return context.get_dummy_value()

    return signature, codegen


@njit(cache=True, nogil=True)
def _stream(dst_address, src_address, blocks):  # pragma: no cover - compiled
    _stream_blocks(dst_address, src_address, blocks)


def stream_copy(dst: np.ndarray, src: np.ndarray) -> None:
    """``dst[...] = src`` for C-contiguous arrays of the same dtype and size, with streaming
    stores for the aligned middle and ordinary copies for the ragged ends."""
    if dst.dtype != src.dtype or dst.size != src.size:
        raise ValueError(f"stream_copy needs equal dtypes and sizes, got {dst.dtype}[{dst.size}] "
                         f"and {src.dtype}[{src.size}]")
    if not (dst.flags.c_contiguous and src.flags.c_contiguous and dst.flags.writeable):
        raise ValueError("stream_copy needs C-contiguous arrays and a writable destination")
    out, data = dst.reshape(-1).view(np.uint8), src.reshape(-1).view(np.uint8)
    address = out.ctypes.data
    head = -address % BLOCK_BYTES
    blocks = (out.size - head) // BLOCK_BYTES if out.size > head else 0
    if blocks == 0:
        np.copyto(out, data)
        return
    tail = head + blocks * BLOCK_BYTES
    out[:head] = data[:head]
    out[tail:] = data[tail:]
    _stream(address + head, data.ctypes.data + head, blocks)
