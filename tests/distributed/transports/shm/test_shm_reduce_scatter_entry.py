"""Shared memory's short entry of a small ``reduce_scatter_tensor``: once the all-reduce plan
it runs on a copy of its input is compiled, the entry makes that plan's compiled call itself
(``shm.short_calls``). On real processes at p = 2 and 3: every dtype and op against NumPy over
more calls than it takes to compile, rank 0's plans kept in Python (the compiled entry meets
the Python form) and rank 1 on the general path every third call; bits equal to an all-reduce
of the same data, this rank's part; the entry replaced only where the plan compiles; an input
still being all-reduced asynchronously read only once that finished; a rank that calls an
all-reduce of the same shape meanwhile is a mismatch on every rank."""
from __future__ import annotations

import os

import numpy as np
import pytest

from collective_references import DTYPES, expected_reduction, inputs_of, ops_for
from dist_harness import run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.transports.shm import compiled

pytest.importorskip("numba")
# compiling the entry kernels with a cold cache takes minutes on two busy cores
pytestmark = pytest.mark.timeout(300)

PART = 5  # elements of each rank's part
CALLS = compiled.HOT_CALLS + 6


def _job(rank: int, ws: int) -> dict:
    from neural_arch.distributed.collectives import tensors
    if rank == 0:  # read when a plan is made: rank 0's plans stay in Python
        os.environ[compiled.ENV_CHOICE] = "python"
    report: dict = {"wrong": [], "replaced": {}, "mismatch": None}
    n = ws * PART
    for dtype in DTYPES:
        for op in ops_for(dtype):
            x = inputs_of(rank, n, dtype, op)
            want = expected_reduction(ws, n, dtype, op)[rank * PART:(rank + 1) * PART]
            first = None
            for call in range(CALLS):
                out = np.full(PART, -1, dtype)
                if rank == 1 and call % 3 == 0:  # the general path, on the queue's thread
                    dist.reduce_scatter_tensor(out, x, op, async_op=True).wait()
                else:
                    dist.reduce_scatter_tensor(out, x, op)
                if first is None:
                    first = tensors._short.reduce_scatter.get((x.dtype, n, op))
                if not np.array_equal(out, want):
                    report["wrong"].append(f"{np.dtype(dtype).name} {op.name} call {call}")
            last = tensors._short.reduce_scatter.get((x.dtype, n, op))
            report["replaced"][f"{np.dtype(dtype).name} {op.name}"] = (
                first is not None and last is not first)
    # float bits a sum's order would change: the entry's part is the all-reduce's, bit for bit
    y = np.random.default_rng(rank).standard_normal(n).astype(np.float32)
    y[0] = -0.0
    for _ in range(CALLS):
        out = np.empty(PART, np.float32)
        dist.reduce_scatter_tensor(out, y, dist.ReduceOp.AVERAGE)
    whole = y.copy()
    dist.all_reduce(whole, dist.ReduceOp.AVERAGE)
    report["bits"] = out.tobytes() == whole[rank * PART:(rank + 1) * PART].tobytes()
    # an input an asynchronous all-reduce is still writing: read once that finished
    x = np.full(n, rank + 1.0, np.float32)
    work = dist.all_reduce(x, async_op=True)
    out = np.empty(PART, np.float32)
    dist.reduce_scatter_tensor(out, x)
    work.wait()
    report["after_async"] = out.tolist()
    # rank 0 all-reduces what the others reduce-scatter: same plan, another collective
    z = np.ones(n, np.float32)
    try:
        if rank == 0:
            dist.all_reduce(z)
        else:
            dist.reduce_scatter_tensor(np.empty(PART, np.float32), z)
    except dist.CollectiveMismatchError as exc:
        report["mismatch"] = str(exc)
    return report


@pytest.mark.parametrize("ws", [2, 3])
def test_small_reduce_scatter_runs_the_compiled_all_reduce_with_its_own_fingerprint(ws):
    summed = ws * ws * (ws + 1) / 2  # the all-reduced input, reduced again
    for rank, report in enumerate(run_ranks(_job, ws, "shm", timeout=280)):
        assert report["wrong"] == [], (rank, report["wrong"])
        assert report["bits"], rank
        assert report["after_async"] == [summed] * PART, (rank, report["after_async"])
        for name, replaced in report["replaced"].items():
            dtype, op = name.split()
            planned = (rank != 0 and np.dtype(dtype).type in compiled.COMPILED_DTYPES
                       and op in {o.name for o in compiled.COMPILED_OPS})
            assert replaced == planned, (rank, name, report["replaced"])
        text = report["mismatch"]
        assert text is not None, rank
        assert "all_reduce" in text and "reduce_scatter" in text, (rank, text)
