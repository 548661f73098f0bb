"""Small broadcasts, all-gathers and reduce-scatters as one all-reduce (``algorithms.summed``),
on the in-process threaded transport, against NumPy: bits, every root, the root check, the
choice by size, and the messages they send."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed import algorithms
from neural_arch.distributed.algorithms import summed
from neural_arch.distributed.errors import CollectiveMismatchError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports.base import Fingerprint
from threaded_transport import Fabric, run_threads

pytestmark = pytest.mark.timeout(120)

DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
SIZES = [0, 1, 2, 3, 7, 13]


def fp(op: str, count: int, dtype=np.float64) -> Fingerprint:
    return Fingerprint(op, 1, np.dtype(dtype).name, count)


def odd_bits(size: int, dtype, salt: int) -> np.ndarray:
    """Values a float sum would change: negative zeros, NaNs with payloads, infinities, and
    the largest magnitudes, among ordinary numbers."""
    rng = np.random.default_rng(salt)
    raw = rng.integers(0, 256, size * np.dtype(dtype).itemsize, dtype=np.uint8)
    out = raw.view(dtype).copy()
    if np.dtype(dtype).kind == "f" and size:
        out[0] = -0.0
        if size > 2:
            bits = out.view(np.uint8).reshape(size, -1)
            bits[1] = 0xFF  # a NaN with every payload bit set (negative, quiet)
    return out


@pytest.mark.parametrize("n", range(1, 9))
def test_broadcast_from_every_root_keeps_the_roots_bits(n):
    cases = [(size, dtype) for size in SIZES + [n + 1] for dtype in DTYPES]
    data = {case: [odd_bits(case[0], case[1], 100 * r + case[0]) for r in range(n)]
            for case in cases}

    def body(t):
        out = []
        for size, dtype in cases:
            for root in range(n):
                buf = data[(size, dtype)][t.rank].copy()
                summed.broadcast(t, buf, root, fp(f"broadcast:{root}", size, dtype))
                planned = data[(size, dtype)][t.rank].copy()
                summed.broadcast_plan(t, planned.nbytes, root)(
                    planned, fp(f"broadcast:{root}", size, dtype))
                assert planned.tobytes() == buf.tobytes()
                out.append(buf)
        return out

    results = run_threads(n, body)
    for rank in range(n):
        got = iter(results[rank])
        for case in cases:
            for root in range(n):
                assert next(got).tobytes() == data[case][root].tobytes(), (case, root, rank)


@pytest.mark.parametrize("n", [3, 4, 5])
def test_ranks_that_pass_different_roots_all_raise_naming_them_and_keep_their_buffers(n):
    def body(t):
        buf = np.full(5, float(t.rank))
        root = 1 if t.rank == n - 1 else 0
        with pytest.raises(CollectiveMismatchError) as err:
            summed.broadcast(t, buf, root, fp(f"broadcast:{root}", 5))
        assert np.array_equal(buf, np.full(5, float(t.rank)))
        # the group is still usable: every message of the failed call was received
        again = np.full(3, float(t.rank))
        summed.broadcast(t, again, 2, fp("broadcast:2", 3))
        assert np.array_equal(again, np.full(3, 2.0))
        return str(err.value).split("] ", 1)[1]  # after the rank's own label

    messages = run_threads(n, body)
    assert len(set(messages)) == 1
    assert f"rank {n - 1} passed root 1" in messages[0]
    assert "passed root 0" in messages[0]


def test_a_root_out_of_range_is_refused_before_any_message():
    t = Fabric(3).transports()[0]
    with pytest.raises(ValueError, match="root rank 3 is out of range for world size 3"):
        summed.broadcast(t, np.zeros(2), 3, fp("broadcast:3", 2))


@pytest.mark.parametrize("n", range(1, 9))
def test_all_gather_keeps_every_ranks_bits(n):
    cases = [(m, dtype) for m in SIZES + [n + 1] for dtype in DTYPES]
    data = {case: [odd_bits(case[0], case[1], 7 * r + case[0]) for r in range(n)]
            for case in cases}

    def body(t):
        out = []
        for m, dtype in cases:
            mine = data[(m, dtype)][t.rank]
            run = summed.all_gather_plan(t, m, np.dtype(dtype).itemsize)
            gathered = np.empty(n * m, dtype)
            run(mine, gathered, fp("all_gather", m, dtype))
            per_call = np.empty(n * m, dtype)
            summed.all_gather(t, mine, per_call, fp("all_gather", m, dtype))
            assert per_call.tobytes() == gathered.tobytes()
            inside = np.empty(n * m, dtype)  # the input a view of its own block of the output
            inside[t.rank * m:(t.rank + 1) * m] = mine
            run(inside[t.rank * m:(t.rank + 1) * m], inside, fp("all_gather", m, dtype))
            out.append((gathered, inside))
        return out

    results = run_threads(n, body)
    for rank in range(n):
        for case, (gathered, inside) in zip(cases, results[rank]):
            expected = np.concatenate(data[case]).tobytes()
            assert gathered.tobytes() == expected and inside.tobytes() == expected, (case, rank)


@pytest.mark.parametrize("n", range(1, 9))
def test_reduce_scatter_matches_numpy_for_every_op_and_dtype(n):
    ops = [ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVERAGE]
    cases = [(m, dtype, op) for m in [0, 1, 3, 5] for dtype in DTYPES for op in ops
             if op is not ReduceOp.AVERAGE or np.dtype(dtype).kind == "f"]
    rng = np.random.default_rng(n)
    data = {case: [rng.choice([-2, -1, 1, 2], n * case[0]).astype(case[1]) for _ in range(n)]
            for case in cases}
    numpy_op = {ReduceOp.SUM: np.sum, ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min,
                ReduceOp.MAX: np.max, ReduceOp.AVERAGE: np.mean}

    def body(t):
        out = []
        for m, dtype, op in cases:
            src = data[(m, dtype, op)][t.rank]
            kept = src.copy()
            part = np.empty(m, dtype)
            summed.reduce_scatter(t, src, part, op, fp("reduce_scatter", n * m, dtype))
            assert np.array_equal(src, kept)  # the caller's input is left alone
            planned = np.empty(m, dtype)
            summed.reduce_scatter_plan(t, dtype, n * m, op)(
                src, planned, fp("reduce_scatter", n * m, dtype))
            assert planned.tobytes() == part.tobytes() and np.array_equal(src, kept)
            out.append(part)
        return out

    results = run_threads(n, body)
    for rank in range(n):
        for (m, dtype, op), part in zip(cases, results[rank]):
            whole = numpy_op[op](np.stack(data[(m, dtype, op)]).astype(np.float64), axis=0)
            np.testing.assert_array_equal(part, whole[rank * m:(rank + 1) * m].astype(dtype),
                                          err_msg=f"{(m, dtype, op)} rank {rank}")


def test_the_choice_by_world_size_and_size():
    three, two = Fabric(3).transports()[0], Fabric(2).transports()[0]
    for collective, other in (("broadcast", "tree"), ("all_gather", "ring"),
                              ("reduce_scatter", "ring")):
        limit = summed.MAX_BYTES[collective]
        assert algorithms.select(collective, three, 0) == "recursive_doubling"
        assert algorithms.select(collective, three, limit) == "recursive_doubling"
        assert algorithms.select(collective, three, limit + 1) == other
        assert algorithms.select(collective, two, 8) == other  # two ranks: one exchange already
        assert algorithms.select(collective, three, limit + 1, "rd") == "recursive_doubling"
        assert algorithms.select(collective, three, 8, other) == other


@pytest.mark.parametrize("n", [3, 4, 5])
def test_each_rank_sends_what_recursive_doubling_sends(n):
    """As many messages as one all-reduce of the vector: log2 n doubling rounds, and a hand-over
    and a hand-back for the ranks past the largest power of two."""
    sent = {}

    def body(t):
        calls = []
        for name in ("send", "sendrecv"):
            method = getattr(t, name)
            setattr(t, name, lambda *a, _m=method, _n=name: (calls.append(_n), _m(*a))[1])
        b = np.zeros(4)
        algorithms.broadcast(t, b, 0, fp("broadcast:0", 4))
        g = np.empty(4 * n)
        algorithms.all_gather(t, np.ones(4), g, fp("all_gather", 4))
        r = np.empty(4)
        algorithms.reduce_scatter(t, np.ones(4 * n), r, ReduceOp.SUM, fp("reduce_scatter", 4 * n))
        sent[t.rank] = len(calls)
        assert np.array_equal(g, np.ones(4 * n)) and np.array_equal(r, np.full(4, float(n)))

    run_threads(n, body)
    pow2 = 1 << (n.bit_length() - 1)
    rounds = pow2.bit_length() - 1
    for rank in range(n):
        extra = rank < 2 * (n - pow2)
        per_call = 1 if extra and rank % 2 == 0 else rounds + (1 if extra else 0)
        assert sent[rank] == 3 * per_call, (rank, sent)
