"""The collective algorithms on the in-process threaded transport, against NumPy references.

Sends on the threaded transport are synchronous, so an algorithm that relies on buffering
deadlocks (and fails on the timeout) instead of passing by luck.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from neural_arch.distributed.algorithms import (dissemination, exchange, recursive_doubling,
                                                ring, tree)
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports.base import Fingerprint
from threaded_transport import Fabric, ThreadedTransport, batched_send_recv_many, run_threads

pytestmark = pytest.mark.timeout(120)

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
OPS = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX]
SIZES = [0, 1, 2, 3, 5, 7, 13, 31, 1000]
ALL_REDUCES = {"ring": ring.all_reduce, "recursive_doubling": recursive_doubling.all_reduce}
NUMPY_REDUCE = {ReduceOp.SUM: np.sum, ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min,
                ReduceOp.MAX: np.max}


def fp(count: int, dtype=np.float64, op: str = "test") -> Fingerprint:
    return Fingerprint(op, 1, np.dtype(dtype).name, count)


def note_calls(monkeypatch, transport, names, note) -> None:
    """Make each call of ``transport``'s methods ``names`` run ``note(name, args)`` first."""
    for name in names:
        method = getattr(transport, name)
        monkeypatch.setattr(transport, name,
                            lambda *a, _m=method, _n=name: (note(_n, a), _m(*a))[1])


def integer_inputs(n: int, size: int, dtype, op: ReduceOp) -> list[np.ndarray]:
    """Small integer values, so every op is exact in every dtype (float16 included)."""
    rng = np.random.default_rng(1000 * n + size)
    if op is ReduceOp.PRODUCT:  # |product| <= 2**n stays exact
        values = rng.choice([-2, -1, 1, 2], size=(n, size))
    else:
        values = rng.integers(-50, 50, size=(n, size))
    return [values[r].astype(dtype) for r in range(n)]


def reference(inputs: list[np.ndarray], op: ReduceOp) -> np.ndarray:
    stacked = np.stack(inputs).astype(np.float64)
    return NUMPY_REDUCE[op](stacked, axis=0).astype(inputs[0].dtype)


@pytest.mark.parametrize("algorithm", sorted(ALL_REDUCES))
@pytest.mark.parametrize("n", range(1, 9))
def test_all_reduce_exact_for_every_size_op_and_dtype(algorithm, n):
    run = ALL_REDUCES[algorithm]
    cases = [(size, dtype, op) for size in SIZES + [n - 1, n + 1] for dtype in DTYPES
             for op in OPS]
    inputs = {case: integer_inputs(n, *case[:2], case[2]) for case in cases}

    def body(t):
        out = []
        for size, dtype, op in cases:
            buf = inputs[(size, dtype, op)][t.rank].copy()
            run(t, buf, op, fp(size, dtype))
            out.append(buf)
        return out

    results = run_threads(n, body)
    for i, case in enumerate(cases):
        expected = reference(inputs[case], case[2])
        for rank in range(n):
            np.testing.assert_array_equal(results[rank][i], expected, err_msg=f"{case} r{rank}")


@pytest.mark.parametrize("algorithm", sorted(ALL_REDUCES))
@pytest.mark.parametrize("n", [2, 3, 5, 6, 8])
def test_all_reduce_floats_bit_identical_on_every_rank(algorithm, n):
    rng = np.random.default_rng(n)
    inputs = {dt: [rng.standard_normal(257).astype(dt) for _ in range(n)]
              for dt in (np.float16, np.float32, np.float64)}

    def body(t):
        out = {}
        for dt, data in inputs.items():
            buf = data[t.rank].copy()
            ALL_REDUCES[algorithm](t, buf, ReduceOp.SUM, fp(buf.size, dt))
            out[dt] = buf
        return out

    results = run_threads(n, body)
    for dt, data in inputs.items():
        for rank in range(1, n):
            assert results[rank][dt].tobytes() == results[0][dt].tobytes(), (dt, rank)
        exact = np.sum(np.stack(data).astype(np.float64), axis=0)
        tol = {np.float16: 5e-2, np.float32: 1e-5, np.float64: 1e-12}[dt]
        np.testing.assert_allclose(results[0][dt].astype(np.float64), exact, rtol=tol, atol=tol * n)


@pytest.mark.parametrize("algorithm", sorted(ALL_REDUCES))
@pytest.mark.parametrize("n", [2, 3, 4, 7])
def test_large_messages_are_cut_into_segments(algorithm, n, monkeypatch):
    monkeypatch.setattr(exchange, "SEGMENT_BYTES", 96)
    size = 1009  # prime: chunks and segments are all uneven
    inputs = [np.arange(size, dtype=np.int64) * (r + 1) for r in range(n)]
    fabric = Fabric(n)

    def body(t):
        buf = inputs[t.rank].copy()
        ALL_REDUCES[algorithm](t, buf, ReduceOp.SUM, fp(size, np.int64))
        return buf

    for buf in run_threads(n, body, fabric=fabric):
        np.testing.assert_array_equal(buf, np.arange(size) * n * (n + 1) // 2)
    assert max(fabric.payload_sizes) <= 96
    assert min(fabric.payload_sizes) > 0  # empty pieces never go on the wire


@pytest.mark.timeout(300)
@pytest.mark.parametrize("algorithm", sorted(ALL_REDUCES))
def test_all_reduce_of_a_million_elements(algorithm):
    n, size = 3, 1_000_003
    inputs = [np.full(size, r + 1, dtype=np.float32) + np.arange(size, dtype=np.float32) % 7
              for r in range(n)]

    def body(t):
        buf = inputs[t.rank].copy()
        ALL_REDUCES[algorithm](t, buf, ReduceOp.SUM, fp(size, np.float32))
        return buf

    expected = 6 + 3 * (np.arange(size) % 7)
    for buf in run_threads(n, body, timeout=240):
        np.testing.assert_array_equal(buf, expected)


@pytest.mark.parametrize("n", range(1, 9))
def test_rooted_collectives_for_every_root(n):
    sizes = [0, 1, 3, n + 2, 17]
    data = {size: [np.arange(size, dtype=np.int64) * 10 + r for r in range(n)] for size in sizes}

    def body(t):
        out = []
        for size in sizes:
            mine = data[size][t.rank]
            for root in range(n):
                b = mine.copy()
                tree.broadcast(t, b, root, fp(size, np.int64, "bcast"))
                r = mine.copy()
                tree.reduce(t, r, root, ReduceOp.SUM, fp(size, np.int64, "reduce"))
                g = np.empty(n * size, np.int64) if t.rank == root else None
                tree.gather(t, mine, g, root, fp(size, np.int64, "gather"))
                full = np.arange(n * size, dtype=np.int64) * 3 + root
                s = np.empty(size, np.int64)
                tree.scatter(t, full if t.rank == root else None, s, root,
                             fp(size, np.int64, "scatter"))
                out.append((size, root, b, r, g, s))
        return out

    results = run_threads(n, body)
    for rank in range(n):
        for size, root, b, r, g, s in results[rank]:
            np.testing.assert_array_equal(b, data[size][root])
            if rank == root:
                np.testing.assert_array_equal(r, np.sum(data[size], axis=0))
                np.testing.assert_array_equal(g, np.concatenate(data[size]))
            else:  # reduce leaves non-root buffers alone
                np.testing.assert_array_equal(r, data[size][rank])
                assert g is None
            full = np.arange(n * size) * 3 + root
            np.testing.assert_array_equal(s, full[rank * size:(rank + 1) * size])


@pytest.mark.parametrize("n", range(1, 9))
def test_ring_all_gather_and_reduce_scatter(n):
    sizes = [0, 1, 2, 5, 64]

    def body(t):
        out = []
        for m in sizes:
            mine = np.arange(m, dtype=np.float64) + 100 * t.rank
            gathered = np.empty(n * m)
            ring.all_gather(t, mine, gathered, fp(m))
            src = np.arange(n * m, dtype=np.float64) * (t.rank + 1)
            kept = src.copy()
            part = np.empty(m)
            ring.reduce_scatter(t, src, part, ReduceOp.SUM, fp(n * m))
            assert np.array_equal(src, kept)  # the caller's input is not modified
            out.append((gathered, part))
        return out

    results = run_threads(n, body)
    for rank in range(n):
        for m, (gathered, part) in zip(sizes, results[rank]):
            np.testing.assert_array_equal(
                gathered, np.concatenate([np.arange(m) + 100 * r for r in range(n)]))
            total = np.arange(n * m) * n * (n + 1) / 2
            np.testing.assert_array_equal(part, total[rank * m:(rank + 1) * m])


@pytest.mark.parametrize("n", range(1, 9))
def test_dissemination_barrier_waits_for_the_last_rank(n):
    arrived = []

    def body(t):
        if t.rank == n - 1:
            import time
            time.sleep(0.2)
        arrived.append(t.rank)
        dissemination.barrier(t, fp(0, np.uint8, "barrier"))
        return len(arrived)

    assert run_threads(n, body) == [n] * n


def test_chunk_bounds_and_segment_pairs():
    assert exchange.chunk_bounds(7, 3) == [(0, 3), (3, 5), (5, 7)]
    assert exchange.chunk_bounds(2, 4) == [(0, 1), (1, 2), (2, 2), (2, 2)]
    pairs = list(exchange.segment_pairs(5, 2, 2))
    assert pairs == [(slice(0, 2), slice(0, 2)), (slice(2, 4), slice(2, 2)),
                     (slice(4, 5), slice(2, 2))]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(n=st.integers(1, 6), size=st.integers(0, 70), seg=st.sampled_from([8, 24, 1 << 20]),
       op=st.sampled_from(OPS), dtype=st.sampled_from(DTYPES),
       algorithm=st.sampled_from(sorted(ALL_REDUCES)))
def test_all_reduce_matches_numpy_for_random_shapes(n, size, seg, op, dtype, algorithm):
    inputs = integer_inputs(n, size, dtype, op)
    old = exchange.SEGMENT_BYTES
    exchange.SEGMENT_BYTES = seg
    try:
        def body(t):
            buf = inputs[t.rank].copy()
            ALL_REDUCES[algorithm](t, buf, op, fp(size, dtype))
            return buf
        results = run_threads(n, body, timeout=30)
    finally:
        exchange.SEGMENT_BYTES = old
    for buf in results:
        np.testing.assert_array_equal(buf, reference(inputs, op))


def test_ring_posts_the_pieces_of_a_window_together(monkeypatch):
    """Piece by piece, every piece waits for the slower rank (a rendezvous each); the ring
    hands a window of pieces to the transport in one call, with the same pieces and bits."""
    monkeypatch.setattr(exchange, "SEGMENT_BYTES", 96)  # 12 int64 per piece
    n, size = 2, 1009
    inputs = [np.arange(size, dtype=np.int64) * (r + 1) for r in range(n)]
    fabric = Fabric(n)
    calls = []

    monkeypatch.setattr(ThreadedTransport, "send_recv_many", batched_send_recv_many)

    def body(t):
        note_calls(monkeypatch, t, ("send", "recv", "sendrecv", "send_recv_many"),
                   lambda name, args: calls.append(name))
        buf = inputs[t.rank].copy()
        ring.all_reduce(t, buf, ReduceOp.SUM, fp(size, np.int64))
        return buf

    for buf in run_threads(n, body, fabric=fabric):
        np.testing.assert_array_equal(buf, np.arange(size) * 3)
    pieces = -(-505 // 12)  # of the larger chunk, per step
    windows = -(-pieces // ring.WINDOW_SEGMENTS)
    # per rank: one reduce-scatter step and one all-gather step
    assert "sendrecv" not in calls and "send" not in calls, calls
    assert calls.count("send_recv_many") == n * 2 * windows, (calls, pieces, windows)
    assert max(fabric.payload_sizes) <= 96 and min(fabric.payload_sizes) > 0


@pytest.mark.parametrize("n", [2, 3])
def test_recursive_doubling_sends_a_one_segment_vector_whole(n, monkeypatch):
    """A vector of one segment (the small messages recursive doubling is chosen for) goes to
    the transport as the caller's buffer itself, one call a message: no piece views made and
    cut per call. With three ranks, rank 0 hands its vector to rank 1 and gets the result."""
    sent: dict = {}

    def body(t):
        buf = np.arange(5, dtype=np.float32) * (t.rank + 1)
        sent[t.rank] = []
        note_calls(monkeypatch, t, ("send", "sendrecv"),
                   lambda name, args: sent[t.rank].append(args[0]))
        recursive_doubling.all_reduce(t, buf, ReduceOp.SUM, fp(5, np.float32))
        return buf

    results = run_threads(n, body)
    for rank, buf in enumerate(results):
        np.testing.assert_array_equal(buf, np.arange(5) * n * (n + 1) / 2)
        assert sent[rank] and all(out is buf for out in sent[rank]), (rank, sent[rank])
