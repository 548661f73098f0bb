"""The plain reference all-reduce of the shm folder (``transports/shm/reference.py``) against
NumPy and, bit for bit, against the fast direct all-reduce, on real rank processes."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import reference as plain
from shm_cases import TINY_WORKSPACE, Calls, rank_input, reference
from shm_testing import run_ranks

pytestmark = pytest.mark.timeout(180)


def both_all_reduces(rank, p, store, workspace_bytes):
    """Each case through the reference and the direct all-reduce; NumPy mismatches of the
    reference, and for random floats the digests of both results."""
    t = shm.create(rank, p, store, 60.0, workspace_bytes=workspace_bytes)
    calls, failures, digests = Calls(), [], []
    try:
        for n in sorted({0, 1, max(p - 1, 1), 13, 4099, 40_009}):
            for dtype, op in ((np.float32, ReduceOp.SUM), (np.float64, ReduceOp.AVERAGE),
                              (np.int64, ReduceOp.MAX), (np.int32, ReduceOp.PRODUCT)):
                buf = rank_input(rank, p, n, dtype, op)
                plain.all_reduce(t, buf, op, calls.fp("all_reduce", buf))
                if not np.array_equal(buf, reference(p, n, dtype, op)):
                    failures.append((n, np.dtype(dtype).name, op.name))
            for dtype, op in ((np.float32, ReduceOp.SUM), (np.float32, ReduceOp.AVERAGE),
                              (np.float16, ReduceOp.SUM), (np.float16, ReduceOp.AVERAGE)):
                g = np.random.default_rng([rank, n])
                mine = g.standard_normal(n).astype(dtype)
                a, b = mine.copy(), mine.copy()
                plain.all_reduce(t, a, op, calls.fp("all_reduce", a))
                t.collectives.all_reduce(b, op, calls.fp("all_reduce", b))
                digests.append((hashlib.sha256(a.tobytes()).hexdigest(),
                                hashlib.sha256(b.tobytes()).hexdigest()))
        return failures, digests
    finally:
        t.close()


@pytest.mark.parametrize("p,workspace", [(2, shm.DEFAULT_WORKSPACE_BYTES), (3, TINY_WORKSPACE),
                                         (4, shm.DEFAULT_WORKSPACE_BYTES)])
def test_reference_matches_numpy_and_the_direct_all_reduce_bit_for_bit(tmp_path, p, workspace):
    results = run_ranks(p, both_all_reduces, workspace, store_dir=str(tmp_path), timeout=150)
    assert all(r.ok for r in results), results
    for r in results:
        failures, digests = r.value
        assert failures == [], f"rank {r.rank}: {failures}"
        assert all(ours == fast for ours, fast in digests), f"rank {r.rank}"
        assert digests == results[0].value[1], f"rank {r.rank} differs from rank 0"
