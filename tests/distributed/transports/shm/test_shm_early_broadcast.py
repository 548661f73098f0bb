"""The compiled small broadcast's root returns without waiting for its readers (``generation``,
``kernels.small_broadcast``): a late reader does not hold it up, the root's next collective of
any kind waits until the readers are done with the half it reuses (results stay exact while the
root runs ahead), and a mismatch or a dead reader is named by the root at that next call; on
four ranks, a late reader of another size is named by every rank, the readers at once."""
from __future__ import annotations

import time

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import compiled as shm_compiled
from shm_cases import Calls
from shm_testing import kill_self, run_ranks, shm_names_of

pytest.importorskip("numba", reason="the compiled small broadcast needs Numba")
pytestmark = pytest.mark.timeout(60)
LATE_S = 0.3  # how late the reader comes


@pytest.fixture(autouse=True)
def compiled(monkeypatch):
    monkeypatch.setenv(shm_compiled.ENV_CHOICE, "compiled")
    monkeypatch.delenv("NEURAL_ARCH_NUMBA", raising=False)


def root_runs_ahead(rank, p, store):
    """Rank 0 broadcasts while rank 1 comes late; then each kind of next call (compiled
    all-reduce, a large all-reduce and a MAX plan in Python, another broadcast) follows an
    early root while the reader is still away, and every value must arrive intact."""
    t = shm.create(rank, p, store, 20.0)
    calls, c, seen = Calls(), t.collectives, []
    try:
        warm = np.zeros(3, np.float64)
        c.broadcast(warm, 0, calls.fp("broadcast", warm))  # compiled, loaded
        # else the root's first timed call settles this one while the reader still loads
        # its kernels, which takes longer than LATE_S on a busy machine
        c.barrier(calls.fp("barrier", warm[:0]))
        root_took = []
        for i, follow in enumerate(("small", "large", "broadcast", "max")):
            buf = np.full(3, float(i + 1)) if rank == 0 else np.zeros(3)
            if rank == 1:
                time.sleep(LATE_S)
            start = time.monotonic()
            c.broadcast(buf, 0, calls.fp("broadcast", buf))
            root_took.append(time.monotonic() - start)
            seen.append(buf.tolist())
            if follow == "broadcast":
                # the same root twice more (the third reuses the half the late reader is yet
                # to read: the root must wait), then the other root
                for value in (20.0 + i, 21.0 + i):
                    more = np.full(3, value) if rank == 0 else np.zeros(3)
                    c.broadcast(more, 0, calls.fp("broadcast", more))
                    seen.append(more.tolist())
                nxt = np.full(3, 10.0 + i) if rank == 1 else np.zeros(3)
                c.broadcast(nxt, 1, calls.fp("broadcast", nxt))
                seen.append(nxt.tolist())
                continue
            n = 100_000 if follow == "large" else 3  # the large one takes c.begin
            op = ReduceOp.MAX if follow == "max" else ReduceOp.SUM  # MAX: a Python plan
            vec = np.full(n, rank + 1.0, np.float32)
            c.all_reduce(vec, op, calls.fp("all_reduce", vec))
            seen.append(float(vec.min()) if vec.min() == vec.max() else "uneven")
        return root_took, seen
    finally:
        t.close()


def test_the_root_returns_before_a_late_reader_and_its_next_call_waits(tmp_path):
    results = run_ranks(2, root_runs_ahead, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    (root_took, root_seen), (_, reader_seen) = (r.value for r in results)
    assert max(root_took) < LATE_S / 2, root_took
    want = [[1.0] * 3, 3.0, [2.0] * 3, 3.0, [3.0] * 3, [22.0] * 3, [23.0] * 3, [12.0] * 3,
            [4.0] * 3, 2.0]
    assert root_seen == want and reader_seen == want, (root_seen, reader_seen)
    assert shm_names_of(r.pid for r in results) == []


def early_root_then(rank, p, store, reader_does):
    """Rank 0 broadcasts (compiled, leaving early); rank 1 all-reduces instead, or dies.
    Rank 0 then calls a compiled all-reduce (after the mismatch) or a barrier, which starts in
    Python (after the death): what did each call end in?"""
    t = shm.create(rank, p, store, 5.0)
    calls, c, ended = Calls(), t.collectives, []
    try:
        buf = np.ones(2, np.float32)
        c.broadcast(buf, 0, calls.fp("broadcast", buf))  # compiled, loaded
        if rank == 1:
            if reader_does == "die":
                kill_self()
            c.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
            return "no error"
        c.broadcast(buf, 0, calls.fp("broadcast", buf))
        ended.append("returned")
        try:
            if reader_does == "die":
                c.barrier(calls.fp("barrier", buf[:0]))
            else:
                c.all_reduce(buf, ReduceOp.SUM, calls.fp("all_reduce", buf))
            ended.append("no error")
        except (CollectiveMismatchError, PeerFailureError) as exc:
            ended.append((type(exc).__name__, exc.peer, exc.op, exc.seq, str(exc)))
        return ended
    finally:
        t.close()


def test_a_mismatch_with_an_early_root_is_named_by_both_sides(tmp_path):
    results = run_ranks(2, early_root_then, "all_reduce", store_dir=str(tmp_path), timeout=30)
    reader = results[1]
    assert reader.error == CollectiveMismatchError.__name__ and reader.peer == 0, reader
    assert "broadcast #2" in reader.message and "all_reduce #2" in reader.message
    assert results[0].ok, results[0]
    returned, (error, peer, op, seq, message) = results[0].value
    assert returned == "returned" and (error, peer, op, seq) == (
        CollectiveMismatchError.__name__, 1, "broadcast", 2), results[0].value
    assert "all_reduce #2" in message, message


def test_a_reader_dead_after_an_early_root_is_named_at_its_next_call(tmp_path):
    results = run_ranks(2, early_root_then, "die", store_dir=str(tmp_path), timeout=30)
    assert results[1].exitcode == -9
    assert results[0].ok, results[0]
    returned, (error, peer, _, _, message) = results[0].value
    assert returned == "returned" and (error, peer) == (PeerFailureError.__name__, 1), message
    assert shm_names_of(r.pid for r in results) == []


def both_roots_then_close(rank, p, store):
    """Each rank takes itself for the root of its last broadcast, then closes: neither waited
    at the broadcast, so closing is where the mismatch must be named."""
    t = shm.create(rank, p, store, 5.0)
    calls, c = Calls(), t.collectives
    buf = np.ones(2, np.float32)
    try:
        c.broadcast(buf, 0, calls.fp("broadcast", buf))  # compiled, loaded
        fp = calls.fp(f"broadcast:{rank}", buf)
        c.broadcast(buf, rank, fp)
    except Exception as exc:  # not here: the roots leave early
        t.close()
        return f"the broadcast raised {exc!r}"
    try:
        t.close()
    except CollectiveMismatchError as exc:
        return (exc.peer, str(exc))
    return "closed without an error"


def test_ranks_that_each_took_the_root_are_told_when_they_close(tmp_path):
    results = run_ranks(2, both_roots_then_close, store_dir=str(tmp_path), timeout=30)
    for rank, r in enumerate(results):
        assert r.ok, r
        _, message = r.value
        assert "rank 0 passed root 0; rank 1 passed root 1" in message, r.value
        assert f"[rank {rank}, broadcast:{rank} #2]" in message, r.value
    assert shm_names_of(r.pid for r in results) == []


def late_reader_of_another_size(rank, p, store):
    """Root 0 broadcasts 5 bytes to three readers; rank 3 comes LATE_S late with 7. Each rank
    then calls a barrier: the mismatch each raised, as (peer named, message)."""
    t = shm.create(rank, p, store, 10.0)
    calls, c = Calls(), t.collectives
    try:
        warm = np.zeros(5, np.uint8)
        c.broadcast(warm, 0, calls.fp("broadcast", warm))  # compiled, loaded
        c.barrier(calls.fp("barrier", warm[:0]))
        n = 7 if rank == 3 else 5
        buf = np.arange(n, dtype=np.uint8) if rank == 0 else np.zeros(n, np.uint8)
        try:
            if rank == 3:  # late past the waiters' liveness looks; it then arrives, raises,
                time.sleep(LATE_S)  # closes and exits while they may be looking
            c.broadcast(buf, 0, calls.fp("broadcast", buf))
            c.barrier(calls.fp("barrier", buf[:0]))
        except CollectiveMismatchError as exc:
            return exc.peer, str(exc)
        return "no error"
    finally:
        t.close()


def test_four_ranks_a_late_reader_of_another_size_is_named_by_all(tmp_path):
    results = run_ranks(4, late_reader_of_another_size, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    # every rank names the broadcast; the readers at once, the root at its barrier
    assert [r.value[0] for r in results] == [3, 3, 3, 0], [r.value for r in results]
    for r in results[:3]:
        assert f"[rank {r.rank}, broadcast #3, peer rank 3]" in r.value[1], r.value
        assert "peer rank 3 called broadcast #3 (group 0, 7 x uint8)" in r.value[1], r.value
    assert "peer rank 0 called broadcast #3 (group 0, 5 x uint8)" in results[3].value[1]
    assert shm_names_of(r.pid for r in results) == []
