"""The short path of ``reduce_scatter_tensor`` (NumPy arrays, default group, synchronous, no
profiler): every dtype, op and shape against NumPy on real processes, its entry made at a
shape's first call (no call of the general path after it), and the calls it must leave to the
general path still working or refused as before; at p = 2 and 3 on every installed backend."""
from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from collective_references import DTYPES, ops_for, expected_reduction, inputs_of
from dist_harness import installed_backends, run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.collectives import tensors

pytestmark = pytest.mark.timeout(120)


def _job(rank: int, ws: int) -> dict:
    from neural_arch.core.tensor import Tensor
    general = tensors.usable_group  # the general path's first step (no entry calls it)
    calls: Counter = Counter()

    def counting(group, op):
        calls[op] += 1
        return general(group, op)
    tensors.usable_group = counting
    report = {"wrong": [], "general": [], "left": []}
    for sweep in range(2):
        calls.clear()
        for dtype in DTYPES:
            for op in ops_for(dtype):
                for shape in [(ws,), (ws * 7,), (ws, 3, 5)]:
                    n = int(np.prod(shape))
                    x = inputs_of(rank, n, dtype, op).reshape(shape)
                    out = np.full(n // ws, -1, dtype)
                    assert dist.reduce_scatter_tensor(out, x, op) is out
                    want = expected_reduction(ws, n, dtype, op)[rank * out.size:
                                                                (rank + 1) * out.size]
                    if not np.array_equal(out, want):
                        report["wrong"].append(f"{np.dtype(dtype).name} {op.name} {shape}")
        report["general"].append(calls["reduce_scatter"])
    # left to the general path: an empty input, a strided output, a Tensor on one rank; refused
    # as before: an output of another size, dtype or a read-only one
    out = np.zeros(0)
    dist.reduce_scatter_tensor(out, np.zeros(0))
    wide = np.zeros(4)
    dist.reduce_scatter_tensor(wide[::2], np.full(2 * ws, rank + 1.0))
    report["left"].append(wide[::2].tolist())
    source = Tensor(np.full(2 * ws, rank + 1.0)) if rank == 0 else np.full(2 * ws, rank + 1.0)
    got = np.zeros(2)
    dist.reduce_scatter_tensor(got, source)
    report["left"].append(got.tolist())
    frozen = np.zeros(2)
    frozen.flags.writeable = False
    cases = [(np.zeros(3), np.zeros(2 * ws), dist.ReduceOp.SUM, ValueError),
             (np.zeros(2, np.float32), np.zeros(2 * ws), dist.ReduceOp.SUM, ValueError),
             (frozen, np.zeros(2 * ws), dist.ReduceOp.SUM, ValueError),
             # no entry is made for these: an integer mean, an input that does not split evenly
             (np.zeros(2, np.int32), np.zeros(2 * ws, np.int32), dist.ReduceOp.AVERAGE,
              TypeError),
             (np.zeros(2), np.zeros(2 * ws + 1), dist.ReduceOp.SUM, ValueError)]
    for bad_out, bad_in, op, exc_type in cases:
        try:
            dist.reduce_scatter_tensor(bad_out, bad_in, op)
            report["left"].append("no error")
        except exc_type as exc:
            report["left"].append(type(exc).__name__)
    report["left_general"] = calls["reduce_scatter"]
    return report


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize("ws", [2, 3])
def test_reduce_scatter_tensor_entries_match_numpy_and_leave_the_rest_alone(backend, ws):
    total = float(sum(range(1, ws + 1)))
    for rank, report in enumerate(run_ranks(_job, ws, backend, timeout=90)):
        assert report["wrong"] == [], report
        # every shape's first call made its entry and ran through it, as every later one did
        assert report["general"] == [0, 0], report
        assert report["left"] == [[total, total], [total, total], "ValueError", "ValueError",
                                  "ValueError", "TypeError", "ValueError"], report
        # the empty input, the strided output, the five refused; and rank 0's Tensor
        assert report["left_general"] == (8 if rank == 0 else 7), report
