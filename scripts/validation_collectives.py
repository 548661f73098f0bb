"""Checks of every collective on integer-valued data whose result is known in closed form, so
every comparison is exact; each algorithm the transport can run is exercised by name."""
from __future__ import annotations

import hashlib

import numpy as np

from neural_arch import distributed as dist
from neural_arch.core import Tensor
from neural_arch.distributed import ReduceOp
from validation_checks import Context, Problems, agree_across_ranks

DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)
OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVERAGE)
LARGE = 100003  # past the small-message threshold and the ring's segment size, and odd


def sizes(n: int) -> list[int]:
    return sorted({0, 1, n - 1, 7, LARGE})


def algorithms_for(collective: str) -> list:
    """``None`` (the automatic choice) and every named algorithm this transport can run."""
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.group.world import world
    usable = [None]
    for name in algorithms.ALGORITHMS[collective]:
        try:
            if name != "auto" and algorithms.select(collective, world().transport, 0, name):
                usable.append(name)
        except ValueError:
            pass  # cannot run on this transport (e.g. native outside MPI)
    return usable


def label(algorithm) -> str:
    return algorithm or "auto"


def rank_input(op: ReduceOp, size: int, rank: int, n: int) -> np.ndarray:
    """Small integers (exact in float16) that rank ``rank`` contributes to a reduction."""
    i = np.arange(size)
    if op is ReduceOp.SUM:
        return (i % 7 + rank + 1).astype(np.float64)
    if op is ReduceOp.PRODUCT:
        return np.array([1.0, 2.0, -1.0])[(i + rank) % 3]
    if op is ReduceOp.AVERAGE:
        return (n * (i % 5) + 2 * rank).astype(np.float64)
    return ((i * 7 + rank * 13) % 31 - 15).astype(np.float64)  # MIN, MAX


def reduced(op: ReduceOp, size: int, n: int) -> np.ndarray:
    """The reduction of every rank's ``rank_input``."""
    i = np.arange(size)
    if op is ReduceOp.SUM:
        return n * (i % 7 + 1) + n * (n - 1) / 2.0
    if op is ReduceOp.AVERAGE:
        return n * (i % 5) + (n - 1.0)
    if op is ReduceOp.PRODUCT:
        # rank r gives 2 when (i + r) % 3 == 1 and -1 when it is 2; count those r in [0, n)
        def ranks_with(k):
            return n // 3 + ((k - i) % 3 < n % 3)
        return 2.0 ** ranks_with(1) * (-1.0) ** ranks_with(2)
    stacked = np.stack([rank_input(op, size, r, n) for r in range(n)])
    return stacked.min(axis=0) if op is ReduceOp.MIN else stacked.max(axis=0)


def block(size: int, k: int, dtype) -> np.ndarray:
    """A distinct, float16-exact block for contributor ``k``."""
    return (np.arange(size) % 1000 + 7 * k).astype(dtype)


def check_all_reduce(ctx: Context) -> str:
    n, problems, h = ctx.world_size, Problems(), hashlib.sha256()
    algos, cases = algorithms_for("all_reduce"), 0
    for op in OPS:
        for dtype in DTYPES:
            if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                continue
            for size in sizes(n):
                want = reduced(op, size, n).astype(dtype)
                for algo in algos:
                    buf = rank_input(op, size, ctx.rank, n).astype(dtype)
                    if ctx.corrupt("all_reduce") and op is ReduceOp.SUM and size:
                        buf[0] += 1
                    what = f"{op.name} {np.dtype(dtype).name} x {size} ({label(algo)})"
                    problems.expect(dist.all_reduce(buf, op, algorithm=algo) is buf,
                                    f"{what} returned another object")
                    problems.expect_equal(buf, want, what)
                    h.update(buf.tobytes())
                    cases += 1
    try:  # refused on the calling rank, before any message: no rank gets out of step
        dist.all_reduce(np.ones(3, dtype=np.int32), ReduceOp.AVERAGE)
        problems.add("AVERAGE of int32 was accepted")
    except TypeError:
        pass
    agree_across_ranks(h.hexdigest(), "all_reduce results", problems)
    return problems.verdict(
        f"{cases} exact cases: 5 ops x 5 dtypes (AVERAGE floats only) x sizes {sizes(n)} x "
        f"algorithms {[label(a) for a in algos]}; bit-identical on all ranks")


def check_broadcast(ctx: Context) -> str:
    n, problems, algos, cases = ctx.world_size, Problems(), algorithms_for("broadcast"), 0
    for root in range(n):
        for algo in algos:
            for dtype in (np.float64, np.int32, np.float16):
                for size in sizes(n):
                    want = block(size, root, dtype)
                    if ctx.rank == root:
                        buf = want + 1 if ctx.corrupt("broadcast") and size else want.copy()
                        buf.flags.writeable = False  # the root's tensor is only read
                    else:
                        buf = np.full(size, -7, dtype=dtype)
                    dist.broadcast(buf, src=root, algorithm=algo)
                    if ctx.rank != root:
                        problems.expect_equal(buf, want, f"root {root} {np.dtype(dtype).name} x "
                                                         f"{size} ({label(algo)})")
                    cases += 1
        t = Tensor(block(5, root, np.float32) if ctx.rank == root else np.zeros(5, np.float32))
        problems.expect(dist.broadcast(t, src=root) is t, "broadcast(Tensor) returned another "
                                                          "object")
        problems.expect_equal(t.array, block(5, root, np.float32), f"Tensor from root {root}")
    return problems.verdict(f"{cases} cases: every root x algorithms {[label(a) for a in algos]} "
                            f"x float64/int32/float16 x sizes {sizes(n)}, plus a Tensor per root")


def check_all_gather(ctx: Context) -> str:
    n, problems, algos, cases = ctx.world_size, Problems(), algorithms_for("all_gather"), 0
    for algo in algos:
        for dtype in (np.float64, np.int64, np.float16):
            for size in sizes(n):
                mine = block(size, ctx.rank + (ctx.corrupt("all_gather") and size > 0), dtype)
                what = f"{np.dtype(dtype).name} x {size} ({label(algo)})"
                gathered = dist.all_gather(mine, algorithm=algo)
                outputs = [np.full(size, -1, dtype=dtype) for _ in range(n)]
                dist.all_gather(outputs, mine, algorithm=algo)
                problems.expect(len(gathered) == n, f"{what}: {len(gathered)} blocks")
                for r in range(min(n, len(gathered))):
                    problems.expect_equal(gathered[r], block(size, r, dtype), f"{what} block {r}")
                    problems.expect_equal(outputs[r], block(size, r, dtype),
                                          f"{what} tensor_list[{r}]")
                cases += 2
    return problems.verdict(f"{cases} cases: algorithms {[label(a) for a in algos]} x "
                            f"float64/int64/float16 x sizes {sizes(n)}, list and tensor_list forms")


def check_reduce_scatter(ctx: Context) -> str:
    n, problems, algos, cases = ctx.world_size, Problems(), algorithms_for("reduce_scatter"), 0
    for algo in algos:
        for op in (ReduceOp.SUM, ReduceOp.MAX, ReduceOp.AVERAGE):
            for dtype in (np.float32, np.int64):
                if op is ReduceOp.AVERAGE and dtype is np.int64:
                    continue
                for chunk in (0, 1, 7, 25001):
                    a = np.arange(n * chunk)
                    mine = (a % 13 + ctx.rank + ctx.corrupt("reduce_scatter")).astype(dtype)
                    total = {ReduceOp.SUM: n * (a % 13) + n * (n - 1) / 2.0,
                             ReduceOp.MAX: a % 13 + (n - 1.0),
                             ReduceOp.AVERAGE: a % 13 + (n - 1) / 2.0}[op]
                    want = total[ctx.rank * chunk:(ctx.rank + 1) * chunk].astype(dtype)
                    what = f"{op.name} {np.dtype(dtype).name} chunk {chunk} ({label(algo)})"
                    got = dist.reduce_scatter(mine, op, algorithm=algo)
                    problems.expect_equal(got, want, what)
                    out = np.full(chunk, -1, dtype=dtype)
                    parts = [mine[r * chunk:(r + 1) * chunk] for r in range(n)]
                    dist.reduce_scatter(out, parts, op, algorithm=algo)
                    problems.expect_equal(out, want, what + " (output, input_list)")
                    cases += 2
    return problems.verdict(f"{cases} cases: algorithms {[label(a) for a in algos]} x "
                            "SUM/MAX/AVERAGE x float32/int64 x chunks 0/1/7/25001, both forms")


def check_reduce(ctx: Context) -> str:
    n, problems, cases = ctx.world_size, Problems(), 0
    for root in range(n):
        for op in (ReduceOp.SUM, ReduceOp.MIN, ReduceOp.PRODUCT):
            for dtype in (np.float64, np.int32):
                for size in sizes(n):
                    mine = rank_input(op, size, ctx.rank, n).astype(dtype)
                    if ctx.corrupt("reduce") and size:
                        mine[-1] -= 1
                    before = mine.copy()
                    dist.reduce(mine, dst=root, op=op)
                    what = f"dst {root} {op.name} {np.dtype(dtype).name} x {size}"
                    want = reduced(op, size, n).astype(dtype) if ctx.rank == root else before
                    problems.expect_equal(mine, want, what)
                    cases += 1
    return problems.verdict(f"{cases} cases: every dst x SUM/MIN/PRODUCT x float64/int32 x sizes "
                            f"{sizes(n)}; other ranks' tensors unchanged")


def check_gather(ctx: Context) -> str:
    n, problems, cases = ctx.world_size, Problems(), 0
    for root in range(n):
        for dtype in (np.float64, np.int32, np.float16):
            for size in sizes(n):
                mine = block(size, ctx.rank + (ctx.corrupt("gather") and size > 0), dtype)
                got = dist.gather(mine, dst=root)
                into = [np.full(size, -1, dtype) for _ in range(n)] if ctx.rank == root else None
                dist.gather(mine, into, dst=root)
                what = f"dst {root} {np.dtype(dtype).name} x {size}"
                if ctx.rank != root:
                    problems.expect(got is None, f"{what}: a non-dst rank got {type(got)}")
                else:
                    for r in range(n):
                        problems.expect_equal(got[r], block(size, r, dtype), f"{what} [{r}]")
                        problems.expect_equal(into[r], block(size, r, dtype),
                                              f"{what} gather_list[{r}]")
                cases += 2
    return problems.verdict(f"{cases} cases: every dst x float64/int32/float16 x sizes "
                            f"{sizes(n)}, returned list and gather_list forms")


def check_scatter(ctx: Context) -> str:
    n, problems, cases = ctx.world_size, Problems(), 0
    for root in range(n):
        for dtype in (np.float64, np.int32, np.float16):
            for size in sizes(n):
                parts = None
                if ctx.rank == root:
                    shift = ctx.corrupt("scatter") and size > 0
                    parts = [block(size, 10 * root + r + shift, dtype) for r in range(n)]
                out = np.full(size, -1, dtype=dtype)
                dist.scatter(out, parts, src=root)
                problems.expect_equal(out, block(size, 10 * root + ctx.rank, dtype),
                                      f"src {root} {np.dtype(dtype).name} x {size}")
                cases += 1
    return problems.verdict(f"{cases} cases: every src x float64/int32/float16 x sizes {sizes(n)}")
