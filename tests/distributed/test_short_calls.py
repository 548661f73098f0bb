"""The compiled short calls of the public ``all_reduce``, ``broadcast`` and ``barrier`` on shm
(``transports/shm/short_calls``), on real processes: a hot call is one compiled step (no
general path, no ``ProcessGroup`` layer), with the general path's bits; ranks on the short and
the general path meet; a mismatch, a dead peer and a timeout are named as on the general
path."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed import algorithms
from neural_arch.distributed.group.process_group import ProcessGroup

pytest.importorskip("numba", reason="the compiled short calls need Numba")
pytestmark = pytest.mark.timeout(60)
COMPILED = {"NEURAL_ARCH_SHM_SMALL": "compiled"}  # compiled from the first call


def _hot_calls(rank, ws):
    """Counts of the layers the hot calls went through, and their results."""
    x, b = np.zeros(3, np.float32), np.zeros((2, 2), np.float64)
    dist.all_reduce(x), dist.broadcast(b, 1), dist.barrier(), dist.barrier()  # makes the plans
    layers = {"run_now": 0, "algorithms": 0}
    run_now, general = ProcessGroup.run_now, {n: getattr(algorithms, n)
                                              for n in ("all_reduce", "broadcast", "barrier")}

    def counting_run_now(self, *args, **kwargs):
        layers["run_now"] += 1
        return run_now(self, *args, **kwargs)

    def counting(name):
        def call(*args, **kwargs):
            layers["algorithms"] += 1
            return general[name](*args, **kwargs)
        return call
    ProcessGroup.run_now = counting_run_now
    for name in general:
        setattr(algorithms, name, counting(name))
    sums, roots = [], []
    try:
        for i in range(20):
            x[...] = [rank + i, 0.1 * (rank + 1), -1e30 if rank else 1e30]
            dist.all_reduce(x)
            sums.append(x.tolist())
            b[...] = rank + 0.5 * i
            dist.broadcast(b, 1)
            roots.append(b.tolist())
            dist.barrier()
    finally:
        ProcessGroup.run_now = run_now
        for name, fn in general.items():
            setattr(algorithms, name, fn)
    return layers, sums, roots


def _left_alone_then_mixed_then_mismatched(rank, ws):
    """After the hot calls: what a hot shape's entry leaves to the general path; rank 0 on
    the short path with the others on the general one; rank 0 calling a barrier while the
    others all-reduce."""
    hot = _hot_calls(rank, ws)
    strided = np.full(6, rank + 1.0, np.float32)[::2]  # the hot shape, strided
    dist.all_reduce(strided)
    frozen = np.zeros(3, np.float32)
    frozen.flags.writeable = False
    try:
        dist.all_reduce(frozen)
        refused = "no error"
    except ValueError as exc:
        refused = str(exc)
    x = np.full(2, rank + 1.0, np.float32)
    for _ in range(3):
        if rank == 0:
            dist.barrier(), dist.all_reduce(x), dist.broadcast(x, 1)
        else:
            dist.barrier(algorithm="auto"), dist.all_reduce(x, algorithm="auto")
            dist.broadcast(x, 1, algorithm="auto")
    try:
        dist.barrier() if rank == 0 else dist.all_reduce(np.ones(1, np.float32))
        message = "no error"
    except dist.CollectiveMismatchError as exc:
        message = str(exc)
    return hot, strided.tolist(), refused, x.tolist(), message


def test_hot_calls_are_one_compiled_step_and_meet_the_general_path():
    ws = 3
    results = run_ranks(_left_alone_then_mixed_then_mismatched, ws, "shm", env=COMPILED)
    for (layers, sums, roots), strided, refused, mixed, message in results:
        assert layers == {"run_now": 0, "algorithms": 0}
        want = [sum(np.array([r + i, 0.1 * (r + 1), -1e30 if r else 1e30], np.float32)
                    for r in range(ws)) for i in range(20)]
        assert sums == [w.tolist() for w in want]  # rank order, in float32
        assert roots == [[[1 + 0.5 * i] * 2] * 2 for i in range(20)]
        assert strided == [6.0] * 3 and "read-only" in refused, (strided, refused)
        assert mixed == results[0][3]
        assert "barrier" in message and "all_reduce:sum" in message, message


def _dies_in_a_barrier(rank, ws):
    for _ in range(5):
        dist.barrier()
    if rank == 1:
        os._exit(3)
    try:
        dist.barrier()
    except dist.PeerFailureError as exc:
        return exc.peer, exc.op, str(exc)
    return None


def test_a_dead_peer_is_named_by_the_short_barrier():
    peer, op, message = run_ranks(_dies_in_a_barrier, 2, "shm", env=COMPILED, may_die=[1])[0]
    assert (peer, op) == (1, "barrier") and "rank 1" in message, message


def _late_peer(rank, ws):
    from neural_arch.distributed.group.world import resolve_group
    dist.barrier()
    resolve_group(None).transport.timeout = 0.3  # read by every wait (the rendezvous is done)
    if rank == 1:
        time.sleep(1.0)  # past rank 0's timeout
        return None
    start = time.monotonic()
    try:
        dist.barrier()
    except dist.CollectiveTimeoutError as exc:
        return exc.op, time.monotonic() - start
    return None


def test_the_short_barrier_times_out():
    op, waited = run_ranks(_late_peer, 2, "shm", env=COMPILED)[0]
    assert op == "barrier" and 0.25 < waited < 0.95
