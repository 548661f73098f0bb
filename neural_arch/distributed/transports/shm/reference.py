"""The direct shared-memory all-reduce at its plainest: read this before ``direct``.

Every rank copies its vector into its own input area of the workspace, all meet at a barrier,
and every rank then reduces all the input areas, in rank order 0..p-1, into its vector. Nothing
else is needed for a correct result: the same operands in the same order give every rank the
same bits. A vector larger than an input area goes in rounds, and consecutive rounds use the
two halves of the workspace in turn (``generation`` says why one barrier a round is then
enough).

``direct`` gets the same results faster: each rank reduces only a 1/p slice of each round and
the others copy it out (p > 2), two ranks reduce whole rounds without copying back out, small
vectors run a plan prepared once per shape, large copies may stream. This version is tested
against it bit for bit; it is not used by the collectives.
"""
from __future__ import annotations

import numpy as np

from ...reduce_ops import ReduceOp, divide_by_count, ufunc_for
from ..base import Fingerprint


def all_reduce(t, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """Reduce the 1-D contiguous ``buf`` over every rank of the shm transport ``t``, in place."""
    c = t.native_collectives()           # its workspace views and fingerprint checks
    inputs, _ = c.views(buf.dtype)       # inputs[half][rank]: one area per rank and half
    combine = ufunc_for(op)              # np.add for SUM and AVERAGE, np.maximum for MAX, ...
    # float16 sums are taken in float32 and rounded once (as reductions.kernels does)
    wide = np.dtype(np.float32) if buf.dtype == np.float16 and combine is np.add else buf.dtype
    step = t.layout.workspace_bytes // buf.itemsize
    gen, sig = c.begin(fp, buf.nbytes)   # the first generation carries the fingerprint check
    for lo in range(0, max(buf.size, 1), step):
        part = buf[lo:lo + step]
        areas = inputs[gen & 1]          # this round's half of the workspace
        areas[t.rank][:part.size] = part          # 1. publish my part
        c.sync(gen, fp, sig if lo == 0 else 0)    # 2. wait until every rank has published
        result = areas[0][:part.size].astype(wide)  # 3. reduce every rank's part, in rank order
        for rank in range(1, t.world_size):
            combine(result, areas[rank][:part.size], out=result)
        if op is ReduceOp.AVERAGE and wide != buf.dtype:
            divide_by_count(result, t.world_size)  # the mean of float16, still in float32
        part[...] = result                        # (float16: rounded once, here)
        gen += 1
    if op is ReduceOp.AVERAGE and wide == buf.dtype:
        divide_by_count(buf, t.world_size)
