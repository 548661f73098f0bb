"""Shared memory's short entry of a small ``all_gather_into_tensor``: once its plan is
compiled, the entry makes the plan's compiled call itself (``shm.two_array_calls``). On real
processes at p = 2 and 3: every dtype against NumPy over more calls than it takes to compile,
rank 0's plans kept in Python (the compiled entry meets the Python form) and rank 1 on the
general path every third call; the entry replaced exactly where the plan compiles; an input an
asynchronous all-reduce is still writing read only once that finished; an all-gather larger
than any plan, a read-only input and a strided output still right; a rank that all-reduces
the same bytes meanwhile is a mismatch on every rank."""
from __future__ import annotations

import os

import numpy as np
import pytest

from collective_references import DTYPES
from dist_harness import run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.transports.shm import compiled

pytest.importorskip("numba")
# compiling the entry kernels with a cold cache takes minutes on two busy cores
pytestmark = pytest.mark.timeout(300)

PART = 5  # elements each rank sends
CALLS = compiled.HOT_CALLS + 6
LARGE = 40_000  # float64 elements a rank: beyond every all-gather plan


def _values(rank: int, n: int, dtype) -> np.ndarray:
    return ((np.arange(n) * 3 + rank * 7) % 120).astype(dtype)


def _job(rank: int, ws: int) -> dict:
    from neural_arch.distributed.collectives import tensors
    if rank == 0:  # read when a plan is made: rank 0's plans stay in Python
        os.environ[compiled.ENV_CHOICE] = "python"
    report: dict = {"wrong": [], "replaced": {}, "mismatch": None}
    for dtype in DTYPES:
        x = _values(rank, PART, dtype)
        want = np.concatenate([_values(r, PART, dtype) for r in range(ws)])
        first = None
        for call in range(CALLS):
            out = np.zeros(ws * PART, dtype)
            if rank == 1 and call % 3 == 0:  # the general path, on the queue's thread
                dist.all_gather_into_tensor(out, x, async_op=True).wait()
            else:
                assert dist.all_gather_into_tensor(out.reshape(ws, PART), x) is not None
            if first is None:
                first = tensors._short.all_gather.get((x.dtype, PART))
            if out.tobytes() != want.tobytes():
                report["wrong"].append(f"{np.dtype(dtype).name} call {call}")
        last = tensors._short.all_gather.get((x.dtype, PART))
        report["replaced"][np.dtype(dtype).name] = first is not None and last is not first
    # an input an asynchronous all-reduce is still writing: read once that finished
    x = np.full(PART, rank + 1.0, np.float32)
    work = dist.all_reduce(x, async_op=True)
    out = np.empty(ws * PART, np.float32)
    dist.all_gather_into_tensor(out, x)
    work.wait()
    report["after_async"] = out.tolist()
    # larger than any plan (the transport's all-gather), a read-only input, a strided output
    big = _values(rank, LARGE, np.float64)
    got = np.empty(ws * LARGE)
    for _ in range(3):
        dist.all_gather_into_tensor(got, big)
    report["large"] = got.tobytes() == np.concatenate(
        [_values(r, LARGE, np.float64) for r in range(ws)]).tobytes()
    frozen = np.full(PART, rank + 0.5)
    frozen.flags.writeable = False
    wide = np.zeros((ws, 2 * PART))
    dist.all_gather_into_tensor(wide[:, ::2], frozen)
    report["frozen_strided"] = wide[:, 0].tolist() + [float(wide[:, 1::2].any())]
    # rank 0 all-reduces the bytes the others all-gather: another collective, a mismatch
    z = np.ones(PART, np.float64)
    try:
        if rank == 0:
            dist.all_reduce(np.ones(ws * PART, np.float64))
        else:
            dist.all_gather_into_tensor(np.empty(ws * PART), z)
    except dist.CollectiveMismatchError as exc:
        report["mismatch"] = str(exc)
    return report


@pytest.mark.parametrize("ws", [2, 3])
def test_small_all_gather_makes_its_compiled_plans_call(ws):
    summed = ws * (ws + 1) / 2
    for rank, report in enumerate(run_ranks(_job, ws, "shm", timeout=280)):
        assert report["wrong"] == [], (rank, report["wrong"])
        assert report["after_async"] == [summed] * (ws * PART), (rank, report["after_async"])
        assert report["large"], rank
        assert report["frozen_strided"] == [r + 0.5 for r in range(ws)] + [0.0], report
        # every dtype compiles (the plan moves bytes), except where rank 0 keeps Python
        assert report["replaced"] == {np.dtype(d).name: rank != 0 for d in DTYPES}, (
            rank, report["replaced"])
        text = report["mismatch"]
        assert text is not None, rank
        assert "all_reduce" in text and "all_gather" in text, (rank, text)
