"""Ranks that disagree on a collective, in a 3-rank job on every transport: one rank (the first,
a middle or the last) all-reduces a different number of elements, a different dtype, with a
different reduce op, or broadcasts while the others all-reduce.

Every rank must end in a named error of its own (``[rank R, <its call> #seq, peer rank P]``)
with at least one CollectiveMismatchError naming both calls; no all-reduce may return, since
no sum over disagreeing calls is right (a broadcast's root may: it keeps its own data); and,
beyond that, each rank should hear of the disagreement from its peers, not from its own
collective timeout. Two-rank mismatches (another collective, size, dtype, a skipped call) on
every backend are in tests/distributed/group/test_process_group_multiprocess.py; the
transports' own header checks in tests/distributed/transports/.
"""
from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks

pytestmark = pytest.mark.timeout(120)
WORLD_SIZE = 3
COLLECTIVE_TIMEOUT_S = 4.0  # a rank that is never told waits this long, then raises
AGREED = "all_reduce:sum #3 (group 0, 8 x float64)"
ODD = {  # what the odd rank calls, as Fingerprint.describe writes it
    "size": "all_reduce:sum #3 (group 0, 70000 x float64)",
    "dtype": "all_reduce:sum #3 (group 0, 8 x float32)",
    "reduce_op": "all_reduce:max #3 (group 0, 8 x float64)",
    "collective": "broadcast:0 #3 (group 0, 8 x float64)",
}
CASES = [("size", 0), ("dtype", 2), ("reduce_op", 1), ("collective", 0), ("collective", 2)]
def disagree(rank: int, world_size: int, kind: str, odd: int) -> tuple:
    from neural_arch import distributed as dist
    for _ in range(2):  # agreed calls first: small all-reduces on shm then take a prepared path
        dist.all_reduce(np.ones(8))
    n, dtype, op = 8, np.float64, dist.ReduceOp.SUM
    if rank == odd:
        n = 70_000 if kind == "size" else n
        dtype = np.float32 if kind == "dtype" else dtype
        op = dist.ReduceOp.MAX if kind == "reduce_op" else op
    x = np.full(n, rank + 1.0, dtype)
    try:
        if rank == odd and kind == "collective":
            dist.broadcast(x, 0)
        else:
            dist.all_reduce(x, op)
    except dist.DistributedError as e:
        return os.getpid(), {"type": type(e).__name__, "rank": e.rank, "peer": e.peer,
                             "message": str(e)}
    return os.getpid(), {"type": None, "unchanged": bool(np.all(x == rank + 1.0))}


@functools.lru_cache(maxsize=None)
def outcome(backend: str, kind: str, odd: int) -> tuple:
    """What each rank ended with (one job per case, shared by the tests below)."""
    results = run_ranks(disagree, WORLD_SIZE, backend, timeout=60, args=(kind, odd),
                        init_kwargs={"timeout": COLLECTIVE_TIMEOUT_S})
    return tuple(report for _, report in results)


def _params() -> list:
    return [pytest.param(backend, kind, odd,
                         marks=[pytest.mark.slow] if backend == "mpi" else [],
                         id=f"{backend}-{kind}-rank{odd}")
            for backend in installed_backends() for kind, odd in CASES]


@pytest.mark.parametrize("backend, kind, odd", _params())
def test_every_rank_ends_in_a_named_error(backend, kind, odd):
    reports = outcome(backend, kind, odd)
    for rank, report in enumerate(reports):
        call = ODD[kind] if rank == odd else AGREED
        if report["type"] is None:  # returned: only a broadcast's root, with its own data
            assert (kind, rank) == ("collective", 0) and report["unchanged"], (rank, report)
            continue
        assert report["rank"] == rank and report["peer"] in set(range(WORLD_SIZE)) - {rank}
        op, seq = call.split(" (")[0].split(" ")
        # A rooted collective first agrees on the root, in messages whose label leaves the root
        # out (``broadcast #3``): an error there names the call without it.
        labels = {f"[rank {rank}, {name} {seq}, peer rank {report['peer']}]"
                  for name in (op, op.split(":")[0])}
        assert any(report["message"].startswith(label) for label in labels), report
    mismatches = [r["message"] for r in reports if r["type"] == "CollectiveMismatchError"]
    odd_calls = (ODD[kind], ODD[kind].replace("broadcast:0 ", "broadcast "))
    assert any(AGREED in m and any(c in m for c in odd_calls) for m in mismatches), reports


@pytest.mark.parametrize("backend, kind, odd", _params())
def test_every_rank_hears_of_it_from_its_peers(backend, kind, odd):
    timed_out = [rank for rank, report in enumerate(outcome(backend, kind, odd))
                 if report["type"] == "CollectiveTimeoutError"]
    assert timed_out == []
