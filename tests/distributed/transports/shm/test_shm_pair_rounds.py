"""The compiled two-rank ``whole`` rounds (``pair_rounds``): the Python loop's bytes, ranks on
either form meeting in the same generations, late peers (waited for mid-loop, woken), a dead
peer named, a mismatch named, and the change-over after HOT_CALLS calls."""
from __future__ import annotations

import hashlib
import os
import time
import types

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint
from neural_arch.distributed.transports.shm import compiled as shm_compiled
from neural_arch.distributed.transports.shm import cross_memory, direct, pair_rounds
from neural_arch.distributed.transports.shm.tuning import Choice
from shm_cases import Calls
from shm_testing import kill_self, run_ranks, shm_names_of

pytest.importorskip("numba", reason="the compiled rounds need Numba")
pytestmark = pytest.mark.timeout(60)

WORKSPACE = 8192
ROUNDS = Choice("whole", 4096)  # rounds of 4 KiB: a few rounds from small vectors
FORMS = (("compiled", "compiled"), ("python", "python"), ("compiled", "python"),
         ("python", "compiled"))


@pytest.fixture(autouse=True)
def built(monkeypatch):
    """The kernels built in the parent, so the forked ranks do not compile them each."""
    monkeypatch.delenv("NEURAL_ARCH_NUMBA", raising=False)
    monkeypatch.delenv(pair_rounds.ENV_CHOICE, raising=False)
    assert pair_rounds.kernels() is not None, pair_rounds.why_not_compiled()


def counted(t) -> list:
    """Counts the compiled runs of ``t``'s rounds (``[runs]``) and every (status, round) their
    kernel hands back (appended after the count)."""
    rounds, seen = t.collectives.pair_rounds, [0]
    run, module = rounds.run, pair_rounds._built["module"]

    def counting_run(*args):
        seen[0] += 1
        run(*args)

    def whole_rounds(*args):
        status, k = module.whole_rounds(*args)
        if status:
            seen.append((status, k))
        return status, k
    rounds.run = counting_run
    pair_rounds._built["module"] = types.SimpleNamespace(
        **{name: getattr(module, name) for name in module.__all__ if name != "whole_rounds"},
        whole_rounds=whole_rounds)
    return seen


def rank_vector(rank: int, n: int, dtype, seed: int) -> np.ndarray:
    """Random values; floats with signed zeros, infinities and NaNs mixed in: a NaN of this
    rank's payload where the peer holds a number, and one NaN on both ranks. (Of two NaNs of
    different payloads NumPy's loops keep either, depending on the element's place in the
    vector, so no form can promise their bits.)"""
    g = np.random.default_rng([rank, n, seed, np.dtype(dtype).num])
    if np.dtype(dtype).kind == "i":
        return g.integers(-1000, 1000, n).astype(dtype)
    x = (g.standard_normal(n) * 100).astype(dtype)
    x[::97] = 0.0 if rank else -0.0
    x[7::103] = np.inf if rank else -np.inf
    x[5 + 40 * rank::101] = np.nan
    bits = x.view(np.int32 if dtype == np.float32 else np.int64)
    bits[5 + 40 * rank::202] ^= rank + 1  # a payload of this rank's own
    x[60::211] = np.nan
    return x


def x0_op_x1(x0: np.ndarray, x1: np.ndarray, op: ReduceOp) -> np.ndarray:
    with np.errstate(all="ignore"):
        if op is ReduceOp.AVERAGE:
            return (x0 + x1) * x0.dtype.type(0.5)
        return {ReduceOp.SUM: np.add, ReduceOp.PRODUCT: np.multiply, ReduceOp.MIN: np.minimum,
                ReduceOp.MAX: np.maximum}[op](x0, x1)


def forms_and_sizes(rank, p, store):
    """Every case under every pair of forms: (wrong results, digests per case, compiled runs)."""
    t = shm.create(rank, p, store, 20.0, workspace_bytes=WORKSPACE)
    c, calls, seen = t.collectives, Calls(), None
    wrong, digests = [], {}
    try:
        seen = counted(t)
        for dtype in (np.float32, np.float64, np.int32):
            step = ROUNDS.round_bytes // np.dtype(dtype).itemsize
            # one round, several full rounds, a short last round
            for n in (step - 3, 3 * step, 3 * step + step // 2 + 1):
                for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT, ReduceOp.MIN,
                           ReduceOp.MAX):
                    if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                        continue
                    x0, x1 = (rank_vector(r, n, dtype, 1) for r in (0, 1))
                    want = x0_op_x1(x0, x1, op).tobytes()
                    for forms in FORMS:
                        c.pair_rounds.choice = forms[rank]
                        buf = (x0, x1)[rank].copy()
                        fp = calls.fp(f"all_reduce:{op.name.lower()}", buf)
                        direct.all_reduce(c, buf, op, fp, ROUNDS)
                        case = (np.dtype(dtype).name, n, op.name, forms)
                        digests[case] = hashlib.sha256(buf.tobytes()).hexdigest()
                        if buf.tobytes() != want:
                            wrong.append(case)
        return wrong, digests, seen[0]
    finally:
        t.close()


def test_compiled_rounds_give_the_python_rounds_bytes_and_mix(tmp_path):
    results = run_ranks(2, forms_and_sizes, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        wrong, digests, runs = r.value
        assert wrong == [], f"rank {r.rank}: {wrong[:4]}"
        assert runs == len(digests) // 2  # half the cases ran compiled on each rank
        assert digests == results[0].value[1]
    by_case = {}
    for (dtype, n, op, forms), digest in results[0].value[1].items():
        by_case.setdefault((dtype, n, op), set()).add(digest)
    assert all(len(d) == 1 for d in by_case.values())  # every pair of forms: the same bytes
    assert shm_names_of(r.pid for r in results) == []


class SlowWriter:
    """A workspace writer that stalls before the third copy of every call (round 2: the peer's
    compiled loop polls past its budget in the middle of its rounds)."""

    def __init__(self, writer) -> None:
        self.writer, self.kind, self.copies = writer, "plain", 0

    def write(self, dst, src) -> None:
        self.copies += 1
        if self.copies % 4 == 3:
            time.sleep(0.03)
        self.writer.write(dst, src)


def late_peers(rank, p, store):
    """Rank 1 late in round 2 of every call (in Python), then late to whole calls (compiled:
    rank 0 falls asleep in the kernel, and rank 1's compiled arrival must wake it)."""
    t = shm.create(rank, p, store, 20.0, workspace_bytes=WORKSPACE)
    c, calls, sums = t.collectives, Calls(), []
    try:
        seen = counted(t)
        n = 4 * 1024  # four rounds of float32
        if rank == 1:
            c.pair_rounds.choice = "python"
            c.writer = SlowWriter(c.writer)
        else:
            c.pair_rounds.choice = "compiled"
        for i in range(3):
            buf = np.full(n, float(rank + i), np.float32)
            direct.all_reduce(c, buf, ReduceOp.SUM, calls.fp("all_reduce:sum", buf), ROUNDS)
            sums.append(float(buf.sum()))
        if rank == 1:
            c.writer = c.writer.writer
        c.pair_rounds.choice = "compiled"
        for i in range(3):
            if rank == 1:
                time.sleep(0.03)
            buf = np.full(n, float(rank + i), np.float32)
            direct.all_reduce(c, buf, ReduceOp.SUM, calls.fp("all_reduce:sum", buf), ROUNDS)
            sums.append(float(buf.sum()))
        return sums, seen
    finally:
        t.close()


def test_late_peers_are_waited_for_mid_loop_and_woken(tmp_path):
    results = run_ranks(2, late_peers, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    want = [4096.0 * (1 + 2 * i) for i in range(3)] * 2
    for r in results:
        assert r.value[0] == want, r.rank
    zero, one = results[0].value[1], results[1].value[1]
    assert zero[0] == 6 and one[0] == 3
    kernels = pair_rounds._built["module"]
    assert (kernels.WAIT, 2) in zero[1:]  # rank 0 polled past its budget in round 2
    assert (kernels.WAKE, 0) in one[1:]  # rank 1 woke the sleeping rank 0


def killed_mid_rounds(rank, p, store):
    t = shm.create(rank, p, store, 10.0, workspace_bytes=WORKSPACE)
    calls, c = Calls(), t.collectives
    c.pair_rounds.choice = "compiled"
    try:
        for i in range(6):
            if rank == 1 and i == 4:
                kill_self()
            buf = np.ones(4 * 1024, np.float32)
            start = time.monotonic()
            try:
                direct.all_reduce(c, buf, ReduceOp.SUM, calls.fp("all_reduce:sum", buf), ROUNDS)
            except PeerFailureError as exc:
                return exc.peer, str(exc), time.monotonic() - start
        return "no error"
    finally:
        t.close()


def test_a_dead_peer_is_named_within_the_timeout(tmp_path):
    results = run_ranks(2, killed_mid_rounds, store_dir=str(tmp_path), timeout=40)
    assert results[1].exitcode == -9
    assert results[0].ok, results[0]
    peer, message, seconds = results[0].value
    assert peer == 1 and "peer rank 1" in message
    assert seconds < 5.0  # the transport's timeout is 10 s: found by the liveness checks
    assert shm_names_of(x.pid for x in results) == []


def mismatched_ops(rank, p, store):
    t = shm.create(rank, p, store, 10.0, workspace_bytes=WORKSPACE)
    try:
        t.collectives.pair_rounds.choice = "compiled"
        buf = np.ones(4 * 1024, np.float32)
        op = ReduceOp.MAX if rank == 1 else ReduceOp.SUM
        direct.all_reduce(t.collectives, buf, op,
                          Fingerprint(f"all_reduce:{op.name.lower()}", 1, "float32", buf.size),
                          ROUNDS)
        return "no error"
    finally:
        t.close()


def test_a_mismatch_names_both_ops(tmp_path):
    results = run_ranks(2, mismatched_ops, store_dir=str(tmp_path), timeout=40)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert r.peer == 1 - r.rank
        assert "all_reduce:sum" in r.message and "all_reduce:max" in r.message


def change_over(rank, p, store):
    """The public path in ``auto`` (peer reads off, so that every table and the built-in choice
    take the two-rank rounds): Python for HOT_CALLS calls."""
    os.environ[cross_memory.ENV_SWITCH] = "0"
    t = shm.create(rank, p, store, 10.0, workspace_bytes=WORKSPACE)
    calls, c = Calls(), t.collectives
    try:
        seen, sums = counted(t), []
        for i in range(shm_compiled.HOT_CALLS + 2):
            buf = np.full(3 * 1024, float(rank + i), np.float64)
            c.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
            sums.append(float(buf[-1]))
        return seen[0], sums, c.pair_rounds.choice
    finally:
        t.close()


def test_auto_compiles_after_hot_calls(tmp_path):
    results = run_ranks(2, change_over, store_dir=str(tmp_path), timeout=40)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.value == (2, [2.0 * i + 1 for i in range(shm_compiled.HOT_CALLS + 2)], "auto")


def test_an_unknown_choice_is_named(monkeypatch):
    monkeypatch.setenv(pair_rounds.ENV_CHOICE, "fastest")
    with pytest.raises(ValueError, match="NEURAL_ARCH_SHM_ROUNDS='fastest'"):
        pair_rounds.choice()
