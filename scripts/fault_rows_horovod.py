"""Row runner for Horovod's named operations: ranks that submit them in different orders, and
a name one rank never submits.

The runner injects its fault once into fresh processes and returns a ``Run`` (``fault_rows``).
The ranks' functions live at module level (here and in tests/horovod_names_job.py), so that
the harness's workers import them.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from dist_harness import RankFailed, run_ranks
from fault_rows import Run
from horovod_names_job import data, missing_name, rows

WORLD = 3
STALL_S = 1.0  # HOROVOD_STALL_SHUTDOWN_TIME_SECONDS of these jobs
COLLECTIVE_TIMEOUT_S = 30.0  # what a rank would wait for a collective that is not coming
ENV = {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_S)}
ORDERS = [("a", "b", "c", "gather", "bcast"), ("c", "bcast", "a", "gather", "b"),
          ("gather", "b", "bcast", "c", "a")]  # a different order on every rank


def _reference() -> dict:
    want = {n: sum(data(n, r) for r in range(WORLD)) for n in ("a", "b", "c")}
    want["gather"] = np.concatenate([rows(r) for r in range(WORLD)])
    want["bcast"] = data("bcast", 0)
    return want


def _submit(hvd, name: str, rank: int):
    if name == "gather":
        return hvd.allgather_async(rows(rank), name=name)
    if name == "bcast":
        return hvd.broadcast_async(data(name, rank), root_rank=0, name=name)
    return hvd.allreduce_async(data(name, rank), name=name, op=hvd.Sum)


def _permuted(rank: int, world_size: int) -> dict:
    import neural_arch.horovod as hvd
    hvd.init()
    handles = {name: _submit(hvd, name, rank) for name in ORDERS[rank]}
    out = {name: hvd.synchronize(handles[name]) for name in reversed(ORDERS[rank])}
    hvd.shutdown()
    return out


def named_orders(tmp: Path) -> Run:
    """Three ranks submit three named allreduces, an allgather and a broadcast, each rank in
    another order; then a job where rank 1 leaves out one name. The time is the slowest
    rank's wait until it was told which name is missing."""
    kwargs = {"timeout": COLLECTIVE_TIMEOUT_S + 30, "env": ENV,
              "init_kwargs": {"timeout": COLLECTIVE_TIMEOUT_S}}
    try:
        results = run_ranks(_permuted, WORLD, "shm", **kwargs)
        missing = run_ranks(missing_name, WORLD, "shm", args=(1,), **kwargs)
    except RankFailed as exc:
        return Run(None, False, f"a rank failed: {exc.summary[:200]}")
    want = _reference()
    wrong = [f"rank {r} {n!r}" for r, out in enumerate(results) for n in want
             if not np.allclose(out[n], want[n], rtol=1e-12, atol=0)]
    errors = [out["error"] or "" for out in missing]
    named = all("'a'" in e and "submitted by ranks [0, 2]" in e and "missing on rank [1]" in e
                for e in errors)
    seconds = max(out["seconds"] for out in missing)
    text = ("every rank's 5 results equal NumPy's" if not wrong
            else f"wrong results: {', '.join(wrong)}")
    text += (f"; the name missing on rank 1 named on every rank (stall limit {STALL_S:g} s)"
             if named else f"; missing name not named: {errors[0][:160] or 'no error'}")
    return Run(seconds, not wrong and named, text)
