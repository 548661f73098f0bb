"""Direct shared-memory collectives on real rank processes, checked against NumPy references."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from neural_arch.distributed.transports.shm import direct
from neural_arch.distributed.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                            PeerFailureError)
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint
from shm_cases import (TINY_WORKSPACE, Calls, check_all_reduce_matrix, mismatched, nan_payloads,
                        other_collectives, random_floats_identical)
from shm_testing import errors_of, kill_self, run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_all_reduce_exact_default_workspace(tmp_path, p):
    results = run_ranks(p, check_all_reduce_matrix, shm.DEFAULT_WORKSPACE_BYTES, p in (2, 3),
                        store_dir=str(tmp_path), timeout=200)
    for r in results:
        assert r.ok, r
        assert r.value == [], f"rank {r.rank} wrong results for {r.value}"
    assert shm_names_of(r.pid for r in results) == []


@pytest.mark.parametrize("p", [2, 4])
def test_all_reduce_exact_many_rounds(tmp_path, p):
    results = run_ranks(p, check_all_reduce_matrix, TINY_WORKSPACE, False,
                        store_dir=str(tmp_path), timeout=200)
    for r in results:
        assert r.ok, r
        assert r.value == [], f"rank {r.rank} wrong results for {r.value}"


@pytest.mark.parametrize("p,workspace", [(2, shm.DEFAULT_WORKSPACE_BYTES), (2, TINY_WORKSPACE),
                                         (3, TINY_WORKSPACE), (4, 64 << 10)])
def test_all_reduce_random_floats_bit_identical(tmp_path, p, workspace):
    results = run_ranks(p, random_floats_identical, workspace, store_dir=str(tmp_path),
                        timeout=200)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.value[0] == [], f"rank {r.rank} differs from the rank-order result: {r.value[0]}"
    assert all(r.value[1] == results[0].value[1] for r in results)


@pytest.mark.parametrize("p", [2, 3])
def test_all_reduce_nan_payloads_bit_identical(tmp_path, p):
    results = run_ranks(p, nan_payloads, store_dir=str(tmp_path), timeout=120)
    assert all(r.ok for r in results), results
    assert all(r.value == results[0].value for r in results)


@pytest.mark.parametrize("p,workspace", [(1, TINY_WORKSPACE), (2, shm.DEFAULT_WORKSPACE_BYTES),
                                         (3, TINY_WORKSPACE), (4, TINY_WORKSPACE)])
def test_broadcast_all_gather_reduce_scatter(tmp_path, p, workspace):
    results = run_ranks(p, other_collectives, workspace, store_dir=str(tmp_path), timeout=200)
    for r in results:
        assert r.ok, r
        assert r.value == [], f"rank {r.rank} wrong results for {r.value}"


def barrier_orders(rank, p, store, marker_dir):
    t = shm.create(rank, p, store, 60.0)
    try:
        seen = []
        for round_no in range(5):
            if rank == round_no % p:
                time.sleep(0.05)  # the late rank: nobody may pass the barrier before it
            open(os.path.join(marker_dir, f"{round_no}.{rank}"), "w").close()
            t.collectives.barrier(Fingerprint("barrier", round_no, "", 0))
            seen.append(sum(os.path.exists(os.path.join(marker_dir, f"{round_no}.{r}"))
                            for r in range(p)))
        return seen
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 4])
def test_barrier_waits_for_every_rank(tmp_path, p):
    markers = tmp_path / "markers"
    markers.mkdir()
    results = run_ranks(p, barrier_orders, str(markers), store_dir=str(tmp_path), timeout=100)
    for r in results:
        assert r.ok, r
        assert r.value == [p] * 5


@pytest.mark.parametrize("kind,p", [("count", 2), ("op", 2), ("seq", 3)])
def test_mismatched_collectives_raise_naming_both_sides(tmp_path, kind, p):
    results = run_ranks(p, mismatched, kind, store_dir=str(tmp_path), timeout=100)
    odd = 1 if kind != "seq" else p - 1
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert f"rank {r.rank}" in r.message
        expected_peer = 0 if r.rank == odd else odd
        assert r.peer == expected_peer, r
        if kind == "count":
            assert "4 x float32" in r.message and "5 x float32" in r.message
        if kind == "op":
            assert "all_reduce" in r.message and "broadcast" in r.message
        if kind == "seq":
            assert "#1" in r.message and "#2" in r.message


def reuse_then_disagree(rank, p, store):
    """One prepared small all-reduce serves calls under several names, between other direct
    collectives that write the same header areas; then the ranks name different ops."""
    t = shm.create(rank, p, store, 30.0)
    calls = Calls()
    try:
        buf = np.ones(4, np.float32)
        for name in ("all_reduce:sum", "ddp_bucket", "all_reduce:sum"):
            for _ in range(3):
                buf[...] = rank + 1
                t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp(name, buf))
                assert buf.tolist() == [p * (p + 1) / 2] * 4, (name, buf)
                other = np.full(8, 7.0 if rank == 0 else 0.0)
                t.collectives.broadcast(other, 0, calls.fp("broadcast", other))
                assert other.tolist() == [7.0] * 8
        name = "all_reduce:sum" if rank == 0 else "all_reduce:max"
        t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp(name, buf))
        return "no error"
    finally:
        t.close()


def reuse_broadcast_then_disagree(rank, p, store):
    """Prepared small broadcasts from every root, between all-reduces that use the same halves
    and header areas; then the ranks name different roots."""
    t = shm.create(rank, p, store, 30.0)
    calls = Calls()
    try:
        buf, counts = np.zeros(5, np.int64), np.ones(3, np.float64)
        for _ in range(3):
            for root in range(p):
                buf[...] = 10 * root + rank
                t.collectives.broadcast(buf, root, calls.fp(f"broadcast:{root}", buf))
                assert buf.tolist() == [10 * root + root] * 5, (root, buf)
                t.collectives.all_reduce(counts, ReduceOp.SUM, calls.fp("all_reduce", counts))
        root = 0 if rank == 0 else 1
        t.collectives.broadcast(buf, root, calls.fp(f"broadcast:{root}", buf))
        return "no error"
    finally:
        t.close()


def reuse_all_gather_then_disagree(rank, p, store):
    """Prepared small all-gathers of two lengths, between broadcasts that use the same halves
    and header areas; then one rank sends a longer block than the others."""
    t = shm.create(rank, p, store, 30.0)
    calls = Calls()
    try:
        for _ in range(3):
            for n in (1, 5):
                mine = np.arange(n, dtype=np.int32) + 100 * rank
                out = np.empty(p * n, np.int32)
                t.collectives.all_gather(mine, out, calls.fp("all_gather", mine))
                expected = np.concatenate([np.arange(n) + 100 * r for r in range(p)])
                assert out.tolist() == expected.tolist(), (n, out)
                flag = np.full(2, rank, np.float64)
                t.collectives.broadcast(flag, p - 1, calls.fp("broadcast", flag))
                assert flag.tolist() == [p - 1.0] * 2
        mine = np.zeros(7 if rank == 0 else 6, np.int32)
        out = np.empty(p * mine.size, np.int32)
        t.collectives.all_gather(mine, out, calls.fp("all_gather", mine))
        return "no error"
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("worker,names", [
    (reuse_then_disagree, ("all_reduce:sum", "all_reduce:max")),
    (reuse_broadcast_then_disagree, ("rank 0 passed root 0", "passed root 1")),
    (reuse_all_gather_then_disagree, ("7 x int32", "6 x int32"))])
def test_reused_prepared_collectives_deliver_and_still_name_mismatches(tmp_path, p, worker,
                                                                      names):
    results = run_ranks(p, worker, store_dir=str(tmp_path), timeout=100)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert names[0] in r.message and names[1] in r.message, r.message


def lonely_barrier(rank, p, store):
    t = shm.create(rank, p, store, 30.0)
    t.timeout = 0.5  # after the rendezvous, which may be slow on a loaded machine
    try:
        if rank == 0:
            try:
                t.collectives.barrier(Fingerprint("barrier", 7, "", 0))
            finally:
                store.set("barrier_ended", b"1")
            return "passed"
        store.get("barrier_ended", timeout=30.0)  # alive but never arrives, until rank 0 ended
        return "slept"
    finally:
        t.close()


def test_barrier_timeout_names_rank_peer_op_seq(tmp_path):
    results = run_ranks(2, lonely_barrier, store_dir=str(tmp_path), timeout=60)
    assert results[1].ok and results[1].value == "slept"
    err = results[0]
    assert err.error == CollectiveTimeoutError.__name__, err
    for part in ("rank 0", "barrier #7", "peer rank 1"):
        assert part in err.message


def killed_mid_job(rank, p, store):
    t = shm.create(rank, p, store, 60.0)
    calls = Calls()
    try:
        buf = np.ones(1000, np.float32)
        for _ in range(3):
            t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
        if rank == 1:
            kill_self()
        big = np.ones(300_000, np.float32)
        t.collectives.all_reduce(big, ReduceOp.SUM, calls.fp("all_reduce", big))
        return "no error"
    finally:
        t.close()


def test_sigkilled_peer_raises_peer_failure(tmp_path):
    results = run_ranks(3, killed_mid_job, store_dir=str(tmp_path), timeout=100)
    assert results[1].exitcode == -9
    for r in (results[0], results[2]):
        # a 60 s timeout would raise CollectiveTimeoutError: this error comes from the pid watch
        assert r.error == PeerFailureError.__name__, r
        assert r.peer == 1 and "peer rank 1" in r.message
    assert shm_names_of(r.pid for r in results) == []


def validation_errors(rank, p, store):
    t = shm.create(rank, p, store, 30.0)
    fp = Fingerprint("x", 1, "float32", 4)
    cases = [
        lambda: t.collectives.all_reduce([1.0, 2.0], ReduceOp.SUM, fp),
        lambda: t.collectives.all_reduce(np.ones((2, 2), np.float32), ReduceOp.SUM, fp),
        lambda: t.collectives.all_reduce(np.ones(8, np.float32)[::2], ReduceOp.SUM, fp),
        lambda: t.collectives.all_reduce(np.ones(4, np.int32), ReduceOp.AVERAGE, fp),
        lambda: t.collectives.all_reduce(np.ones(4, np.uint8), ReduceOp.SUM, fp),
        lambda: t.collectives.broadcast(np.ones(4, np.float32), p, fp),
        lambda: t.collectives.all_gather(np.ones(4, np.float32), np.ones(5, np.float32), fp),
        lambda: t.collectives.reduce_scatter(np.ones(5, np.float32), np.ones(2, np.float32),
                                          ReduceOp.SUM, fp),
    ]
    try:
        return errors_of(cases), (t.native_collectives() is t.collectives)
    finally:
        t.close()


def test_bad_arguments_raise_before_any_communication(tmp_path):
    results = run_ranks(2, validation_errors, store_dir=str(tmp_path), timeout=60)
    for r in results:
        assert r.ok, r
        found, supported = r.value
        assert supported is True
        assert [m.split(":")[0] for m in found] == [
            "TypeError", "ValueError", "ValueError", "TypeError", "TypeError", "ValueError",
            "ValueError", "ValueError"], found
        assert "(2, 2)" in found[1] and "int32" in found[3] and "uint8" in found[4]
        assert "2" in found[5] and "5" in found[6]


@pytest.mark.parametrize("p", [2, 3, 4, 5, 8])
def test_slices_partition_every_round(p):
    for itemsize in (2, 4, 8):
        for m in (0, 1, p - 1, p, 17, 1000, 262_144 // itemsize):
            parts = [direct.slice_of(m, p, r, itemsize) for r in range(p)]
            covered = np.zeros(m, np.int64)
            for lo, hi in parts:
                assert 0 <= lo <= hi <= m
                covered[lo:hi] += 1
                assert lo * itemsize % direct.ALIGN_BYTES == 0 or lo == m
            assert np.all(covered == 1), (p, itemsize, m, parts)
