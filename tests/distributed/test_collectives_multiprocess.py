"""Every public collective on real processes, for every installed backend and world sizes 1-4.

Each (backend, world size) pair starts its processes once for all three suites and runs many
checks in them; inputs are small integers (exact in every dtype), so each rank compares its
results with a closed-form or NumPy reference computed from every rank's inputs. Float results
on random data are hashed and compared across ranks in the parent: they must be bit-identical;
for every op they must also have the exact bits of the reduction order the algorithm documents
(ring, recursive doubling, shm_direct), or be close to a float64 reference where none is
documented. Messages of a million elements and more run through every collective. The other
algorithms of the non-all-reduce collectives, async order and subgroups:
``test_collectives_groups``.
"""
from __future__ import annotations

import numpy as np
import pytest

from collective_references import (DTYPES, FLOAT_OPS, FORCED, FORCED_OTHERS, INIT, LARGE,
                                   WORLD_SIZES, check_float_reduction, digest,
                                   expected_reduction, forced, inputs_of, ops_for, random_of)
from dist_harness import each_case, job_once, run_ranks
from neural_arch import distributed as dist
from neural_arch.core.tensor import Tensor
from neural_arch.distributed import algorithms as algos
from neural_arch.distributed.algorithms.exchange import chunk_bounds
from neural_arch.distributed.group.world import resolve_group

pytestmark = pytest.mark.timeout(300)


LARGE_PAIRS = ((np.float32, dist.ReduceOp.SUM), (np.int64, dist.ReduceOp.MAX),
               (np.float16, dist.ReduceOp.PRODUCT), (np.int32, dist.ReduceOp.MIN),
               (np.float64, dist.ReduceOp.AVERAGE), (np.int64, dist.ReduceOp.PRODUCT))


def all_reduce_suite(rank: int, ws: int, algorithms: list) -> list[str]:
    sizes = sorted({0, 1, 2, max(ws - 1, 0), 7, 13, 8191})
    large_wanted = {(dtype, op): expected_reduction(ws, LARGE, dtype, op)
                    for dtype, op in LARGE_PAIRS}
    for algorithm in [None] + algorithms:
        for size in sizes:
            for dtype in DTYPES:
                for op in ops_for(dtype):
                    x = inputs_of(rank, size, dtype, op)
                    out = dist.all_reduce(x, op, algorithm=algorithm)
                    assert out is x
                    np.testing.assert_array_equal(x, expected_reduction(ws, size, dtype, op),
                                                  err_msg=f"{algorithm} {size} {dtype} {op}")
        for dtype, op in LARGE_PAIRS:
            x = inputs_of(rank, LARGE, dtype, op)
            dist.all_reduce(x, op, algorithm=algorithm)
            np.testing.assert_array_equal(x, large_wanted[(dtype, op)],
                                          err_msg=f"{algorithm} {LARGE} {dtype} {op}")
    hashes = []
    rng = np.random.default_rng(rank)
    for algorithm in [None] + algorithms:
        for dtype in (np.float16, np.float32, np.float64):
            for size in (1000, 100_003):
                x = rng.standard_normal(size).astype(dtype)
                dist.all_reduce(x, dist.ReduceOp.SUM, algorithm=algorithm)
                hashes.append(digest(x))
    # every op on random floats: the documented reduction order's exact bits (a tolerance for
    # MPI's native op), and a hash that must be the same on every rank
    transport = resolve_group(None).transport
    for salt, dtype in enumerate((np.float16, np.float32, np.float64)):
        for size in (1000, 100_003):
            parts = [random_of(r, size, dtype, salt) for r in range(ws)]
            bounds = chunk_bounds(size, ws)
            for algorithm in [None] + algorithms:
                ran = algos.select("all_reduce", transport, parts[0].nbytes, algorithm)
                for op in FLOAT_OPS:
                    x = parts[rank].copy()
                    dist.all_reduce(x, op, algorithm=algorithm)
                    check_float_reduction(x, parts, op, ran, bounds,
                                          f"{algorithm} ({ran}) {size} {dtype} {op}")
                    hashes.append(digest(x))
    # Tensors and non-contiguous views are changed in place
    t = Tensor(np.full((3, 4), rank + 1.0, dtype=np.float32))
    assert dist.all_reduce(t) is t
    np.testing.assert_array_equal(t.array, np.full((3, 4), ws * (ws + 1) / 2, dtype=np.float32))
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
        if ws == 3:
            large_rooted(rank, ws, root)
    return True


def large_rooted(rank: int, ws: int, root: int) -> None:
    """Reduce, gather and scatter of a million elements and more: several 1 MiB segments, so
    the tree's segment loops run (and gather / scatter move many megabytes)."""
    for dtype, op in ((np.float64, dist.ReduceOp.SUM), (np.int32, dist.ReduceOp.MIN),
                      (np.float32, dist.ReduceOp.AVERAGE)):
        x = inputs_of(rank, LARGE, dtype, op, salt=root)
        assert dist.reduce(x, dst=root, op=op) is x
        want = (expected_reduction(ws, LARGE, dtype, op, salt=root) if rank == root
                else inputs_of(rank, LARGE, dtype, op, salt=root))
        np.testing.assert_array_equal(x, want, err_msg=f"large reduce {root} {dtype} {op}")
    mine = np.arange(LARGE, dtype=np.int64) * (rank + 1) - root
    got = dist.gather(mine, dst=root)
    if rank == root:
        assert len(got) == ws
        for r in range(ws):
            np.testing.assert_array_equal(got[r], np.arange(LARGE, dtype=np.int64) * (r + 1) - root)
    else:
        assert got is None
    out = np.zeros(LARGE + 1, np.float32)
    parts = ([np.arange(LARGE + 1, dtype=np.float32) + 3 * r + root for r in range(ws)]
             if rank == root else None)
    assert dist.scatter(out, parts, src=root) is out
    np.testing.assert_array_equal(out, np.arange(LARGE + 1, dtype=np.float32) + 3 * rank + root)

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
            # in place: the input is this rank's block of the output (ZeRO's parameter gather)
            flat[...] = -1
            flat[rank] = mine
            assert dist.all_gather_into_tensor(flat, flat[rank]) is flat
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
    choices = FORCED_OTHERS[dist.get_backend()]
    # all-gather of a million elements per rank, under each algorithm
    mine = np.arange(LARGE, dtype=np.int32) * (rank + 1) - rank
    for choice in choices + ["in place"]:
        flat_big = np.empty(ws * LARGE, np.int32)
        if choice == "in place":  # the input is this rank's block of the output
            flat_big[rank * LARGE:(rank + 1) * LARGE] = mine
            dist.all_gather_into_tensor(flat_big, flat_big[rank * LARGE:(rank + 1) * LARGE])
        else:
            dist.all_gather_into_tensor(flat_big, mine, algorithm=forced("all_gather", choice))
        for r in range(ws):
            np.testing.assert_array_equal(flat_big[r * LARGE:(r + 1) * LARGE],
                                          np.arange(LARGE, dtype=np.int32) * (r + 1) - r,
                                          err_msg=f"all_gather {choice} block {r}")
    del flat_big
    # reduce-scatter of random floats: each rank's chunk has the exact bits of the algorithm's
    # documented reduction order, and the gathered result is hashed (same on every rank)
    hashes = [digest(flat)]
    transport = resolve_group(None).transport
    for salt, dtype in enumerate((np.float16, np.float32, np.float64)):
        for m in (1001, 100_003):
            parts = [random_of(r, ws * m, dtype, salt) for r in range(ws)]
            bounds = [(i * m, (i + 1) * m) for i in range(ws)]
            for choice in choices:
                algorithm = forced("reduce_scatter", choice)
                ran = algos.select("reduce_scatter", transport, parts[0].nbytes, algorithm)
                for op in FLOAT_OPS:
                    out = np.empty(m, dtype)
                    dist.reduce_scatter_tensor(out, parts[rank], op, algorithm=algorithm)
                    whole = np.empty(ws * m, dtype)
                    dist.all_gather_into_tensor(whole, out)
                    np.testing.assert_array_equal(whole[rank * m:(rank + 1) * m], out)
                    check_float_reduction(whole, parts, op, ran, bounds,
                                          f"reduce_scatter {choice} ({ran}) {m} {dtype} {op}")
                    hashes.append(digest(whole))
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
    return hashes


def every_suite(rank: int, ws: int, algorithms: list) -> dict:
    """The three suites above in turn, in one job: {suite name: its result on this rank}."""
    suites = {"all_reduce": lambda: all_reduce_suite(rank, ws, algorithms),
              "rooted": lambda: rooted_suite(rank, ws), "gathers": lambda: gather_suite(rank, ws)}
    return each_case(lambda name: suites[name](), list(suites), "suite")


# Each (backend, world size) starts its processes once: the first of the three tests below to
# run starts a job that runs all three suites, and each test checks its own suite's results.
_JOBS: dict = {}


def suite_results(backend: str, world_size: int, name: str) -> list:
    """Every rank's result of suite ``name`` at (``backend``, ``world_size``)."""
    job = job_once(_JOBS, (backend, world_size), lambda: run_ranks(
        every_suite, world_size, backend, timeout=280, args=(FORCED[backend],),
        init_kwargs=INIT))
    return [by_suite[name] for by_suite in job]


# ----- tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_all_reduce_every_algorithm_size_op_and_dtype(backend, world_size):
    hashes = suite_results(backend, world_size, "all_reduce")
    for rank in range(1, world_size):
        assert hashes[rank] == hashes[0], f"rank {rank} differs from rank 0"


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rooted_collectives_for_every_root(backend, world_size):
    assert suite_results(backend, world_size, "rooted") == [True] * world_size


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_gathers_scatters_point_to_point_and_objects(backend, world_size):
    hashes = suite_results(backend, world_size, "gathers")
    assert all(h == hashes[0] for h in hashes)
