"""AVERAGE on the direct shared-memory all-reduce: the bits of the sum followed by one division
by p, on every path (the prepared small vectors, Python and compiled; two ranks' rounds; the
rounds of three), at the lengths where a path or a kernel changes over."""
from __future__ import annotations

import hashlib
import os

import numpy as np
import pytest

from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.reductions import kernels as reduction_kernels
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import compiled, direct
from shm_cases import Calls, rank_order_reduction
from shm_testing import run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(120)

DTYPES = (np.float16, np.float32, np.float64)


def lengths(dtype, p: int) -> list:
    """0, 1, odd, and each side of every threshold: the compiled reduction kernels' minimum,
    the small path's limit, one round of the large paths (and a few rounds)."""
    itemsize = np.dtype(dtype).itemsize
    small = direct.SMALL_BYTES // itemsize
    step = min(direct.ROUND_BYTES, shm.DEFAULT_WORKSPACE_BYTES) // itemsize
    edges = (reduction_kernels.COMPILED_MIN_ELEMENTS, small, step)
    return sorted({0, 1, p, 7, *(e + d for e in edges for d in (-1, 0, 1)), 2 * step + 3})


def rank_values(rank: int, n: int, dtype) -> np.ndarray:
    """Random values, and every eighth one among the dtype's smallest (subnormal) numbers,
    where a mean rounds (x/p is not exact) and a wrong order or scaling shows in the bits."""
    values = np.random.default_rng([rank, n, np.dtype(dtype).num]).standard_normal(n)
    values = values.astype(dtype)
    tiny = np.finfo(dtype).smallest_subnormal
    values[::8] = tiny * np.arange(1, values[::8].size + 1) * (rank + 1)
    return values


def averages_match(rank, p, store, small_mode):
    """Every length and dtype: this rank's AVERAGE against the rank-order reference; returns
    the mismatches and a digest of every result (the same on every rank)."""
    os.environ[compiled.ENV_CHOICE] = small_mode  # read as each shape's plan is built
    t = shm.create(rank, p, store, 60.0)
    calls, wrong, digests = Calls(), [], []
    try:
        for dtype in DTYPES:
            for n in lengths(dtype, p):
                inputs = [rank_values(r, n, dtype) for r in range(p)]
                expected = rank_order_reduction(inputs, ReduceOp.AVERAGE)
                buf = inputs[rank].copy()
                t.collectives.all_reduce(buf, ReduceOp.AVERAGE, calls.fp("all_reduce", buf))
                if buf.tobytes() != expected.tobytes():
                    wrong.append((np.dtype(dtype).name, n,
                                  np.flatnonzero(buf.view(np.uint8) != expected.view(np.uint8))
                                  [:3].tolist()))
                digests.append(hashlib.sha256(buf.tobytes()).hexdigest())
        return wrong, digests
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("small_mode", ["python", "compiled"])
def test_average_bits_at_every_threshold(tmp_path, p, small_mode):
    results = run_ranks(p, averages_match, small_mode, store_dir=str(tmp_path), timeout=110)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.value[0] == [], f"rank {r.rank} of {p}: AVERAGE differs from the reference " \
                                 f"(dtype, length, first differing bytes): {r.value[0]}"
        assert r.value[1] == results[0].value[1], f"rank {r.rank} differs from rank 0"
    assert shm_names_of(r.pid for r in results) == []


@pytest.mark.skipif(reduction_kernels.kernels() is None, reason="needs the compiled kernels")
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("rank", [0, 1])
def test_pair_round_mean_checks_nothing_per_round(monkeypatch, dtype, rank):
    """Two ranks average each round in the compiled loop, chosen once per all-reduce: a round
    runs the kernel itself, not the checks of ``pair_mean`` again."""
    reduce_round = direct.pair_round(np.dtype(dtype), ReduceOp.AVERAGE, rank)

    def checked_again(*arrays):
        raise AssertionError("a round checked its vectors again")
    monkeypatch.setattr(reduction_kernels, "_compiled_for", checked_again)
    mine, peer = rank_values(rank, 5000, dtype), rank_values(1 - rank, 5000, dtype)
    part = mine.copy()
    reduce_round(part, peer)
    x0, x1 = (mine, peer) if rank == 0 else (peer, mine)
    assert part.tobytes() == ((x0 + x1) / dtype(2)).tobytes()
