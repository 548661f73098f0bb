"""Every public collective on real processes, for every installed backend and world sizes 1-4.

Each (backend, world size) pair starts its processes once per suite and runs many checks in
them; inputs are small integers (exact in every dtype), so each rank compares its results with
a closed-form or NumPy reference computed from every rank's inputs. Float results on random
data are hashed and compared across ranks in the parent: they must be bit-identical.
"""
from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch import distributed as dist
from neural_arch.core.tensor import Tensor

pytestmark = pytest.mark.timeout(300)

WORLD_SIZES = [1, 2, 3, 4]
DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
       dist.ReduceOp.AVERAGE]
LARGE = 1_000_003  # prime, above a million
FORCED = {"shm": ["ring", "recursive_doubling", "shm_direct"],
          "tcp": ["ring", "recursive_doubling"],
          "mpi": ["ring", "recursive_doubling", "native"]}
# the algorithms of broadcast / all-gather / reduce-scatter / barrier, by backend
FORCED_OTHERS = {"shm": [None, "portable", "shm_direct"], "tcp": [None, "portable"],
                 "mpi": [None, "portable", "native"]}
PORTABLE = {"broadcast": "tree", "all_gather": "ring", "reduce_scatter": "ring",
            "barrier": "dissemination"}
INIT = {"timeout": 60}


def inputs_of(rank: int, size: int, dtype, op, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, size, OPS.index(op), salt])
    if op is dist.ReduceOp.PRODUCT:
        values = rng.choice([-2, -1, 1, 2], size=size)
    else:
        values = rng.integers(-50, 50, size=size)
    return values.astype(dtype)


def expected_reduction(ws: int, size: int, dtype, op, salt: int = 0) -> np.ndarray:
    stacked = np.stack([inputs_of(r, size, dtype, op, salt) for r in range(ws)]).astype(np.float64)
    kind = {dist.ReduceOp.PRODUCT: np.prod, dist.ReduceOp.MIN: np.min,
            dist.ReduceOp.MAX: np.max}.get(op, np.sum)
    result = kind(stacked, axis=0).astype(dtype)
    if op is dist.ReduceOp.AVERAGE:
        result = np.divide(result, np.dtype(dtype).type(ws))
    return result


def ops_for(dtype):
    return [op for op in OPS if op is not dist.ReduceOp.AVERAGE or np.dtype(dtype).kind == "f"]


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


# ----- suites, run on every rank -----------------------------------------------------------
def all_reduce_suite(rank: int, ws: int, algorithms: list) -> list[str]:
    sizes = sorted({0, 1, 2, max(ws - 1, 0), 7, 13, 8191})
    for algorithm in [None] + algorithms:
        for size in sizes:
            for dtype in DTYPES:
                for op in ops_for(dtype):
                    x = inputs_of(rank, size, dtype, op)
                    out = dist.all_reduce(x, op, algorithm=algorithm)
                    assert out is x
                    np.testing.assert_array_equal(x, expected_reduction(ws, size, dtype, op),
                                                  err_msg=f"{algorithm} {size} {dtype} {op}")
        for dtype, op in ((np.float32, dist.ReduceOp.SUM), (np.int64, dist.ReduceOp.MAX)):
            x = inputs_of(rank, LARGE, dtype, op)
            dist.all_reduce(x, op, algorithm=algorithm)
            np.testing.assert_array_equal(x, expected_reduction(ws, LARGE, dtype, op))
    hashes = []
    rng = np.random.default_rng(rank)
    for algorithm in [None] + algorithms:
        for dtype in (np.float16, np.float32, np.float64):
            for size in (1000, 100_003):
                x = rng.standard_normal(size).astype(dtype)
                dist.all_reduce(x, dist.ReduceOp.SUM, algorithm=algorithm)
                hashes.append(digest(x))
    # Tensors and non-contiguous views are changed in place
    t = Tensor(np.full((3, 4), rank + 1.0, dtype=np.float32))
    assert dist.all_reduce(t) is t
    np.testing.assert_array_equal(t.data, np.full((3, 4), ws * (ws + 1) / 2, dtype=np.float32))
    base = np.zeros((4, 6))
    view = base[:, ::2]
    view[...] = rank
    dist.all_reduce(view, dist.ReduceOp.MAX)
    np.testing.assert_array_equal(base[:, ::2], ws - 1)
    np.testing.assert_array_equal(base[:, 1::2], 0)
    return hashes


def rooted_suite(rank: int, ws: int) -> bool:
    for root in range(ws):
        for size in (0, 1, 13):
            for dtype in DTYPES:
                mine = inputs_of(rank, size, dtype, dist.ReduceOp.SUM, salt=root)
                everyone = [inputs_of(r, size, dtype, dist.ReduceOp.SUM, salt=root)
                            for r in range(ws)]
                b = mine.copy()
                assert dist.broadcast(b, src=root) is b
                np.testing.assert_array_equal(b, everyone[root])
                for op in ops_for(dtype):
                    x = inputs_of(rank, size, dtype, op, salt=root)
                    assert dist.reduce(x, dst=root, op=op) is x
                    want = (expected_reduction(ws, size, dtype, op, salt=root) if rank == root
                            else inputs_of(rank, size, dtype, op, salt=root))
                    np.testing.assert_array_equal(x, want, err_msg=f"reduce {root} {op}")
                listed = [np.empty_like(mine) for _ in range(ws)] if rank == root else None
                got = dist.gather(mine, listed, dst=root)
                fresh = dist.gather(mine, dst=root)
                if rank == root:
                    assert got is listed
                    for r in range(ws):
                        np.testing.assert_array_equal(listed[r], everyone[r])
                        np.testing.assert_array_equal(fresh[r], everyone[r])
                else:
                    assert got is None and fresh is None
                out = np.empty_like(mine)
                parts = [e * 2 for e in everyone] if rank == root else None
                assert dist.scatter(out, parts, src=root) is out
                np.testing.assert_array_equal(out, everyone[rank] * 2)
        big = np.arange(LARGE, dtype=np.float32) if rank == root else np.zeros(LARGE, np.float32)
        dist.broadcast(Tensor(big), src=root)
        np.testing.assert_array_equal(big, np.arange(LARGE, dtype=np.float32))
    return True


def forced(collective: str, choice):
    return PORTABLE[collective] if choice == "portable" else choice


def forced_algorithms_suite(rank: int, ws: int, choices: list) -> bool:
    """Broadcast, all-gather, reduce-scatter and barrier under each of their algorithms."""
    for choice in choices:
        for dtype in (np.float32, np.int64):
            for size in (0, 1, 13, 70_001):
                for root in range(ws):
                    b = np.arange(size, dtype=dtype) * (rank + 1)
                    dist.broadcast(b, src=root, algorithm=forced("broadcast", choice))
                    np.testing.assert_array_equal(b, np.arange(size, dtype=dtype) * (root + 1))
                mine = np.arange(size, dtype=dtype) + rank
                flat = np.empty(ws * size, dtype)
                dist.all_gather_into_tensor(flat, mine, algorithm=forced("all_gather", choice))
                np.testing.assert_array_equal(
                    flat, np.concatenate([np.arange(size, dtype=dtype) + r for r in range(ws)]))
                listed = dist.all_gather(mine, algorithm=forced("all_gather", choice))
                np.testing.assert_array_equal(np.concatenate(listed), flat)
                full = np.arange(ws * size, dtype=dtype) * (rank + 1)
                out = np.empty(size, dtype)
                dist.reduce_scatter_tensor(out, full, dist.ReduceOp.SUM,
                                           algorithm=forced("reduce_scatter", choice))
                total = np.arange(ws * size, dtype=dtype) * (ws * (ws + 1) // 2)
                np.testing.assert_array_equal(out, total[rank * size:(rank + 1) * size])
                avg = np.full(ws * size, float(rank), dtype=np.float32)
                part = dist.reduce_scatter(avg, dist.ReduceOp.AVERAGE,
                                           algorithm=forced("reduce_scatter", choice))
                np.testing.assert_array_equal(part, np.full(size, (ws - 1) / 2, np.float32))
        dist.barrier(algorithm=forced("barrier", choice))
    return True


def gather_suite(rank: int, ws: int) -> list[str]:
    for dtype in DTYPES:
        for shape in ((0,), (1,), (3, 2), (5,)):
            mine = np.full(shape, rank * 10, dtype=dtype) + np.arange(
                int(np.prod(shape)), dtype=dtype).reshape(shape)
            want = [np.full(shape, r * 10, dtype=dtype) + mine - rank * 10 for r in range(ws)]
            listed = [np.empty(shape, dtype) for _ in range(ws)]
            assert dist.all_gather(listed, mine) is listed
            for got, exp in zip(listed + dist.all_gather(mine), want + want):
                np.testing.assert_array_equal(got, exp)
            flat = np.empty((ws,) + shape, dtype)
            assert dist.all_gather_into_tensor(flat, mine) is flat
            np.testing.assert_array_equal(flat, np.stack(want))
        for op in ops_for(dtype):
            full = [inputs_of(r, ws * 6, dtype, op).reshape(ws * 3, 2) for r in range(ws)]
            reduced = expected_reduction(ws, ws * 6, dtype, op).reshape(ws * 3, 2)
            chunk = dist.reduce_scatter(full[rank].copy(), op)
            np.testing.assert_array_equal(chunk, reduced[rank * 3:(rank + 1) * 3])
            out = np.empty((3, 2), dtype)
            assert dist.reduce_scatter(out, list(np.split(full[rank], ws)), op) is out
            np.testing.assert_array_equal(out, reduced[rank * 3:(rank + 1) * 3])
            out2 = np.empty(6, dtype)
            assert dist.reduce_scatter_tensor(out2, full[rank], op) is out2
            np.testing.assert_array_equal(out2, reduced[rank * 3:(rank + 1) * 3].reshape(-1))
    big = np.full(LARGE, rank, dtype=np.float64)
    chunk = dist.reduce_scatter(np.tile(big, ws), dist.ReduceOp.SUM)
    np.testing.assert_array_equal(chunk, np.full(LARGE, ws * (ws - 1) / 2))
    dist.barrier()
    # point to point around the ring, then the object tier
    if ws > 1:
        msg = np.full(7, rank, dtype=np.int64)
        got = np.empty(7, dtype=np.int64)
        if rank % 2 == 0:
            dist.send(msg, (rank + 1) % ws)
            dist.recv(got, (rank - 1) % ws)
        else:
            dist.recv(got, (rank - 1) % ws)
            dist.send(msg, (rank + 1) % ws)
        np.testing.assert_array_equal(got, np.full(7, (rank - 1) % ws))
    objs = dist.all_gather_object({"rank": rank, "name": "r" * rank})
    assert objs == [{"rank": r, "name": "r" * r} for r in range(ws)]
    filled = [None] * ws
    assert dist.all_gather_object(filled, (rank, [rank] * rank)) is filled
    assert filled == [(r, [r] * r) for r in range(ws)]
    for src in range(ws):
        items = [src, "x" * src, {"k": np.arange(src)}] if rank == src else [None, None, None]
        assert dist.broadcast_object_list(items, src=src) is items
        assert items[:2] == [src, "x" * src]
        np.testing.assert_array_equal(items[2]["k"], np.arange(src))
    return [digest(flat)]


def async_and_groups_suite(rank: int, ws: int) -> bool:
    rng = np.random.default_rng(rank)
    bufs = [np.full(50 + i, float(rank + i)) for i in range(5)]
    works = []
    for i, buf in enumerate(bufs):
        time.sleep(rng.uniform(0, 0.01))  # ranks issue at different moments
        works.append(dist.all_reduce(buf, async_op=True))
        if i == 2:
            works.append(dist.broadcast(np.full(3, float(rank)), src=ws - 1, async_op=True))
    gathered = dist.all_gather(np.array([rank]))  # synchronous: runs after the queued work
    assert [int(g[0]) for g in gathered] == list(range(ws))
    for work in works:
        assert work.is_completed() and work.wait(timeout=30)
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf, np.full(50 + i, ws * i + ws * (ws - 1) / 2))
    assert np.array_equal(works[3].result(), np.full(3, float(ws - 1)))
    # subgroups: every rank creates each group, members use it, non-members are refused
    evens = dist.new_group(list(range(0, ws, 2)))
    ends = dist.new_group([ws - 1, 0])
    everyone = dist.new_group()
    for group, members in ((evens, list(range(0, ws, 2))), (ends, sorted({0, ws - 1})),
                           (everyone, list(range(ws)))):
        if rank in members:
            assert dist.get_rank(group) == members.index(rank)
            assert dist.get_world_size(group) == len(members)
            x = np.array([rank, 1], dtype=np.int64)
            dist.all_reduce(x, group=group)
            assert x.tolist() == [sum(members), len(members)]
            b = np.array([rank], dtype=np.int32)
            dist.broadcast(b, src=members[-1], group=group)
            assert int(b[0]) == members[-1]
            assert [int(g[0]) for g in dist.all_gather(np.array([rank]), group=group)] == members
            assert dist.all_gather_object(rank, group=group) == members
            w = dist.all_reduce(np.ones(4), group=group, async_op=True)
            np.testing.assert_array_equal(w.result(), np.full(4, len(members)))
        else:
            assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
            try:
                dist.all_reduce(np.ones(2), group=group)
            except ValueError as exc:
                assert f"rank {rank} is not a member" in str(exc)
            else:
                raise AssertionError("a non-member ran a collective on the group")
    # the world group still works, and its sequence numbers were not disturbed
    x = np.ones(3)
    dist.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(3, ws))
    return True


# ----- tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_every_algorithm_size_op_and_dtype(backend, world_size):
    hashes = run_ranks(all_reduce_suite, world_size, backend, timeout=280,
                       args=(FORCED[backend],), init_kwargs=INIT)
    for rank in range(1, world_size):
        assert hashes[rank] == hashes[0], f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rooted_collectives_for_every_root(backend, world_size):
    assert run_ranks(rooted_suite, world_size, backend, timeout=280,
                     init_kwargs=INIT) == [True] * world_size


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gathers_scatters_point_to_point_and_objects(backend, world_size):
    hashes = run_ranks(gather_suite, world_size, backend, timeout=280, init_kwargs=INIT)
    assert all(h == hashes[0] for h in hashes)


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_algorithm_of_the_other_collectives(backend, world_size):
    assert run_ranks(forced_algorithms_suite, world_size, backend, timeout=200,
                     args=(FORCED_OTHERS[backend],), init_kwargs=INIT) == [True] * world_size


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_async_order_and_subgroups(backend, world_size):
    assert run_ranks(async_and_groups_suite, world_size, backend, timeout=120,
                     init_kwargs=INIT) == [True] * world_size
