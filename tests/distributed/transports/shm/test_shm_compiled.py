"""The compiled small all-reduce (``shm_compiled``): the direct-collective checks of
``test_shm_direct`` (``shm_cases``) with every small all-reduce compiled, ranks on the compiled
and the Python path in one job, the change-over after HOT_CALLS calls, and its errors."""
from __future__ import annotations

import hashlib
import os
import time

import numpy as np
import pytest

from neural_arch.distributed.transports.shm import compiled as shm_compiled
from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint
from shm_cases import (Calls, check_all_reduce_matrix, mismatched, nan_payloads,
                       other_collectives, random_floats_identical, rank_input, reference)
from shm_testing import kill_self, run_ranks, shm_names_of

pytest.importorskip("numba", reason="the compiled small all-reduce needs Numba")
pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def compiled(monkeypatch):
    """Every small all-reduce of the rank processes compiled from its first call."""
    monkeypatch.setenv(shm_compiled.ENV_CHOICE, "compiled")
    monkeypatch.delenv("NEURAL_ARCH_NUMBA", raising=False)


def prepared_kinds(t, collective: str = "all_reduce") -> set:
    """Where the prepared ``collective``s of ``t`` run: 'compiled', 'python' or 'counting'."""
    kinds = set()
    for key, run in t.collectives.plans.items():
        if key[0] == collective:  # plans are keyed (collective, ...)
            kinds.add("counting" if run.__qualname__.startswith("build.") else
                      "compiled" if run.__module__ == shm_compiled.__name__ else "python")
    return kinds


def matrix_then_kinds(rank, p, store):
    failures = check_all_reduce_matrix(rank, p, store, shm.DEFAULT_WORKSPACE_BYTES, False)
    return failures, shm_compiled.why_not_compiled()


@pytest.mark.parametrize("p", [2, 3, 4])
def test_compiled_all_reduce_exact(tmp_path, compiled, p):
    results = run_ranks(p, matrix_then_kinds, store_dir=str(tmp_path), timeout=250)
    for r in results:
        assert r.ok, r
        failures, why = r.value
        assert failures == [], f"rank {r.rank} wrong results for {failures}"
        assert why == "", why
    assert shm_names_of(r.pid for r in results) == []


@pytest.mark.parametrize("p", [2, 3, 4])
def test_compiled_random_floats_match_the_rank_order_reduction(tmp_path, compiled, p):
    results = run_ranks(p, random_floats_identical, 64 << 10, store_dir=str(tmp_path),
                        timeout=250)
    assert all(r.ok for r in results), results
    for r in results:
        failures, digests = r.value
        assert failures == [], f"rank {r.rank}: {failures}"
        assert digests == results[0].value[1]


def test_compiled_nan_payloads_bit_identical(tmp_path, compiled):
    results = run_ranks(3, nan_payloads, store_dir=str(tmp_path), timeout=120)
    assert all(r.ok for r in results), results
    assert all(r.value == results[0].value for r in results)


@pytest.mark.parametrize("p", [2, 3, 4])
def test_compiled_broadcast_and_all_gather_exact(tmp_path, compiled, p):
    results = run_ranks(p, other_collectives, shm.DEFAULT_WORKSPACE_BYTES,
                        store_dir=str(tmp_path), timeout=250)
    for r in results:
        assert r.ok, r
        assert r.value == [], f"rank {r.rank} wrong results for {r.value}"


def mixed_paths(rank, p, store):
    """Even ranks compiled, odd ranks in Python, in one job: random floats and exact ints."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled" if rank % 2 == 0 else "python"
    t = shm.create(rank, p, store, 60.0)
    calls, digests, failures = Calls(), [], []
    try:
        for n in (1, 7, 4099):
            for dtype in (np.float32, np.float64):
                for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT):
                    for round_ in range(3):  # both halves of the workspace, and back
                        g = np.random.default_rng([rank, n, round_, np.dtype(dtype).num])
                        buf = g.uniform(0.5, 1.5, n).astype(dtype)
                        t.collectives.all_reduce(buf, op, calls.fp("all_reduce", buf))
                        digests.append(hashlib.sha256(buf.tobytes()).hexdigest())
            for dtype in (np.int32, np.int64):
                buf = rank_input(rank, p, n, dtype, ReduceOp.SUM)
                t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
                if not np.array_equal(buf, reference(p, n, dtype, ReduceOp.SUM)):
                    failures.append((n, np.dtype(dtype).name))
            for root in range(p):
                data = np.arange(n, dtype=np.float16) + root
                buf = data.copy() if rank == root else np.zeros(n, np.float16)
                t.collectives.broadcast(buf, root, calls.fp("broadcast", buf))
                if not np.array_equal(buf, data):
                    failures.append((n, "broadcast", root))
            mine = np.arange(n, dtype=np.int64) * (rank + 1)
            out = np.zeros(p * n, np.int64)
            t.collectives.all_gather(mine, out, calls.fp("all_gather", mine))
            if not np.array_equal(out, np.concatenate([np.arange(n) * (r + 1) for r in range(p)])):
                failures.append((n, "all_gather"))
        kinds = [prepared_kinds(t, c) for c in ("all_reduce", "broadcast", "all_gather")]
        return failures, digests, kinds
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 3])
def test_compiled_and_python_ranks_meet_with_the_same_bits(tmp_path, p):
    results = run_ranks(p, mixed_paths, store_dir=str(tmp_path), timeout=200)
    assert all(r.ok for r in results), results
    for r in results:
        failures, digests, kinds = r.value
        assert failures == [], f"rank {r.rank}: {failures}"
        assert digests == results[0].value[1], f"rank {r.rank} differs from rank 0"
        want = {"compiled"} if r.rank % 2 == 0 else {"python"}
        assert kinds == [want] * 3, (r.rank, kinds)


def change_over(rank, p, store):
    """Kinds of the prepared all-reduce before and after HOT_CALLS calls (auto choice)."""
    os.environ[shm_compiled.ENV_CHOICE] = "auto"
    t = shm.create(rank, p, store, 60.0)
    calls, seen, sums = Calls(), [], []
    try:
        for i in range(shm_compiled.HOT_CALLS + 3):
            if i in (0, shm_compiled.HOT_CALLS - 1, shm_compiled.HOT_CALLS + 2):
                seen.append(prepared_kinds(t))
            buf = np.full(3, i + rank, np.float64)
            t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
            sums.append(float(buf[0]))
        minmax = np.full(3, float(rank))  # MIN is never compiled
        for _ in range(shm_compiled.HOT_CALLS + 1):
            t.collectives.all_reduce(minmax, ReduceOp.MIN, calls.fp("all_reduce", minmax))
        seen.append(prepared_kinds(t))
        for i in range(shm_compiled.HOT_CALLS + 1):
            if i == shm_compiled.HOT_CALLS - 1:
                seen.append(prepared_kinds(t, "broadcast") | prepared_kinds(t, "all_gather"))
            one = np.full(2, float(rank + i))
            t.collectives.broadcast(one, 0, calls.fp("broadcast", one))
            both = np.zeros(2 * p)
            t.collectives.all_gather(one, both, calls.fp("all_gather", one))
            sums.append(float(both.sum()))
        seen.append(prepared_kinds(t, "broadcast") | prepared_kinds(t, "all_gather"))
        return seen, sums
    finally:
        t.close()


def test_prepared_collectives_are_compiled_after_hot_calls(tmp_path):
    results = run_ranks(2, change_over, store_dir=str(tmp_path), timeout=120)
    assert all(r.ok for r in results), results
    for r in results:
        seen, sums = r.value
        assert seen == [set(), {"counting"}, {"compiled"}, {"compiled", "python"},
                        {"counting"}, {"compiled"}], seen
        hot = shm_compiled.HOT_CALLS
        assert sums == [2.0 * i + 1 for i in range(hot + 3)] + [4.0 * i for i in range(hot + 1)]


def stays_python(rank, p, store, env):
    os.environ.update(env)
    t = shm.create(rank, p, store, 60.0)
    calls = Calls()
    try:
        for _ in range(shm_compiled.HOT_CALLS + 2):
            buf = np.ones(2, np.float32)
            t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
        return prepared_kinds(t)
    finally:
        t.close()


@pytest.mark.parametrize("env", [{shm_compiled.ENV_CHOICE: "python"},
                                 {shm_compiled.ENV_CHOICE: "compiled", "NEURAL_ARCH_NUMBA": "0"}])
def test_switched_off_the_all_reduce_stays_in_python(tmp_path, env):
    results = run_ranks(2, stays_python, env, store_dir=str(tmp_path), timeout=120)
    assert [r.value for r in results] == [{"python"}, {"python"}], results


def test_an_unknown_choice_is_named(monkeypatch):
    monkeypatch.setenv(shm_compiled.ENV_CHOICE, "fastest")
    with pytest.raises(ValueError, match="NEURAL_ARCH_SHM_SMALL='fastest'"):
        shm_compiled.choice()


def late_peer(rank, p, store):
    """The last rank comes late to every other call, so the others wait past the polls, and
    some fall asleep in the kernel and must be woken by the late rank's compiled arrival."""
    t = shm.create(rank, p, store, 60.0)
    calls, sums = Calls(), []
    try:
        for i in range(12):
            if rank == p - 1 and i % 2:
                time.sleep(0.02 * (i % 4))
            buf = np.full(5, float(rank + i), np.float32)
            t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
            sums.append(float(buf[0]))
        return sums, prepared_kinds(t)
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 3])
def test_late_peers_are_waited_for_and_woken(tmp_path, compiled, p):
    results = run_ranks(p, late_peer, store_dir=str(tmp_path), timeout=120)
    assert all(r.ok for r in results), results
    for r in results:
        sums, kinds = r.value
        assert sums == [float(sum(range(p)) + p * i) for i in range(12)]
        assert kinds == {"compiled"}


def mismatched_ops(rank, p, store):
    t = shm.create(rank, p, store, 30.0)
    try:
        buf = np.ones(4, np.float32)
        op = ReduceOp.PRODUCT if rank == 1 else ReduceOp.SUM
        name = f"all_reduce:{op.name.lower()}"
        for seq in (1, 2):  # the first call passes the header; the second compares signatures
            fp = Fingerprint(name if seq == 2 else "all_reduce", seq, "float32", buf.size)
            t.collectives.all_reduce(buf, op if seq == 2 else ReduceOp.SUM, fp)
        return "no error"
    finally:
        t.close()


def test_compiled_mismatch_names_both_sides(tmp_path, compiled):
    results = run_ranks(2, mismatched_ops, store_dir=str(tmp_path), timeout=100)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert r.peer == 1 - r.rank
        assert "all_reduce:sum" in r.message and "all_reduce:product" in r.message


def test_compiled_broadcast_against_an_all_reduce_is_named(tmp_path, compiled):
    results = run_ranks(2, mismatched, "op", store_dir=str(tmp_path), timeout=100)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert r.peer == 1 - r.rank
        assert "all_reduce" in r.message and "broadcast" in r.message


def killed_while_compiled(rank, p, store):
    t = shm.create(rank, p, store, 60.0)
    calls = Calls()
    try:
        for i in range(40):
            if rank == 1 and i == 30:
                kill_self()
            buf = np.ones(3, np.float32)
            t.collectives.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
        return "no error"
    finally:
        t.close()


def test_a_killed_peer_is_named_on_the_compiled_path(tmp_path, compiled):
    results = run_ranks(3, killed_while_compiled, store_dir=str(tmp_path), timeout=100)
    assert results[1].exitcode == -9
    for r in (results[0], results[2]):
        assert r.error == PeerFailureError.__name__, r
        assert r.peer == 1 and "peer rank 1" in r.message
    assert shm_names_of(r.pid for r in results) == []


def test_the_polls_give_the_core_away_before_handing_a_late_peer_to_python():
    """A peer not yet arrived is polled ``polls`` times, then once after each of YIELDS
    ``sched_yield`` calls (ranks that outnumber cores let the late one run), then reported."""
    from neural_arch.distributed.transports.shm import kernels
    from neural_arch.distributed.transports.shm.layout import GEN, LINE_WORDS
    words = np.zeros(3 * LINE_WORDS, np.int64)
    words[LINE_WORDS + GEN] = 4  # rank 1 is at generation 4, rank 2 at 3
    words[2 * LINE_WORDS + GEN] = 3
    assert kernels.YIELDS > 0
    assert not kernels._peers_reached(words, 0, 3, 4, 1)  # one poll, then every yield
    assert not kernels._peers_reached(words, 0, 3, 4, 100)
    words[2 * LINE_WORDS + GEN] = 4
    assert kernels._peers_reached(words, 0, 3, 4, 1)
    assert kernels._peers_reached(words, 1, 3, 4, 1) is False  # rank 0 is still at 0
