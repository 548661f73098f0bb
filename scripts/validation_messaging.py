"""Checks of point-to-point messages, the barrier, the object tier and asynchronous work."""
from __future__ import annotations

import time

import numpy as np

from neural_arch import distributed as dist
from neural_arch.distributed import ReduceOp
from validation_checks import Context, Problems
from validation_collectives import LARGE, algorithms_for, block, label

def check_send_recv(ctx: Context) -> str:
    n, problems, cases = ctx.world_size, Problems(), 0
    nxt, prev = (ctx.rank + 1) % n, (ctx.rank - 1) % n
    for dtype in (np.float64, np.int32, np.float16):
        for size in (1, 7, LARGE):
            for tag in (0, 5):
                outgoing = block(size, ctx.rank + ctx.corrupt("send_recv"), dtype)
                inbox = np.full(size, -1, dtype=dtype)
                # even ranks send first, odd ranks receive first: the ring cannot deadlock
                if ctx.rank % 2 == 0:
                    dist.send(outgoing, dst=nxt, tag=tag)
                    dist.recv(inbox, src=prev, tag=tag)
                else:
                    dist.recv(inbox, src=prev, tag=tag)
                    dist.send(outgoing, dst=nxt, tag=tag)
                problems.expect_equal(inbox, block(size, prev, dtype),
                                      f"from rank {prev} {np.dtype(dtype).name} x {size} tag {tag}")
                cases += 1
    return problems.verdict(f"{cases} messages around the ring 0 -> 1 -> ... -> {n - 1} -> 0: "
                            f"float64/int32/float16 x sizes 1/7/{LARGE} x tags 0/5")


def check_barrier(ctx: Context) -> str:
    """Ranks arrive staggered and leave a marker file first: after a real barrier every rank
    sees all markers (the work directory is shared: every rank runs on this host)."""
    n, problems, algos = ctx.world_size, Problems(), algorithms_for("barrier")
    markers = ctx.work_dir / "barrier"
    markers.mkdir(exist_ok=True)
    for algo in algos:
        for round_ in range(2):
            time.sleep(0.05 * ctx.rank)
            if not ctx.corrupt("barrier"):
                (markers / f"{label(algo)}_{round_}_rank{ctx.rank}").touch()
            dist.barrier(algorithm=algo)
            missing = [r for r in range(n)
                       if not (markers / f"{label(algo)}_{round_}_rank{r}").exists()]
            problems.expect(not missing, f"{label(algo)} round {round_}: left before ranks "
                                         f"{missing} arrived")
    return problems.verdict(f"2 staggered rounds x algorithms {[label(a) for a in algos]}: no "
                            "rank left before the last one arrived")


def rich_object(k: int) -> dict:
    """A picklable object whose size and content depend on ``k``."""
    return {"rank": k, "text": "\u00fc" * (300 * k), "array": np.arange(5 * k, dtype=np.float64),
            "nested": [k, (k, str(k)), None]}


def objects_equal(a, b) -> bool:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        return (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a.dtype == b.dtype
                and a.shape == b.shape and np.array_equal(a, b))
    if isinstance(a, dict):
        return (isinstance(b, dict) and a.keys() == b.keys()
                and all(objects_equal(a[k], b[k]) for k in a))
    if isinstance(a, (list, tuple)):
        return (type(a) is type(b) and len(a) == len(b)
                and all(objects_equal(x, y) for x, y in zip(a, b)))
    return type(a) is type(b) and a == b


def check_all_gather_object(ctx: Context) -> str:
    n, problems = ctx.world_size, Problems()
    mine = rich_object(ctx.rank + ctx.corrupt("all_gather_object"))
    everyone = dist.all_gather_object(mine)
    torch_form = [None] * n
    dist.all_gather_object(torch_form, mine)
    for form, got in (("returned list", everyone), ("object_list", torch_form)):
        problems.expect(len(got) == n, f"{form} has {len(got)} entries, expected {n}")
        for r in range(min(n, len(got))):
            problems.expect(objects_equal(got[r], rich_object(r)),
                            f"{form}[{r}] differs from rank {r}'s object")
    return problems.verdict(f"{n} objects (dict, str up to {600 * (n - 1)} bytes, array, "
                            "nested tuple) in both call forms")


def check_broadcast_object_list(ctx: Context) -> str:
    n, problems = ctx.world_size, Problems()
    for root in range(n):
        want = [rich_object(root), f"from {root}", (root, 2.5)]
        if ctx.rank == root:
            objects = [rich_object(root + ctx.corrupt("broadcast_object_list")), want[1], want[2]]
        else:
            objects = [None] * len(want)
        dist.broadcast_object_list(objects, src=root)
        for i, (got, expected) in enumerate(zip(objects, want)):
            problems.expect(objects_equal(got, expected), f"src {root} object [{i}] differs")
    return problems.verdict(f"every src of {n}: a list of 3 objects arrives intact")


def check_async_ops(ctx: Context) -> str:
    """Asynchronous all-reduces finish in issue order with the right values."""
    n, problems = ctx.world_size, Problems()
    lengths = [LARGE, 1, 7, 4096, LARGE, 3, 100, 7]
    bufs = [np.full(size, float(k + ctx.rank)) for k, size in enumerate(lengths)]
    if ctx.corrupt("async_ops"):
        bufs[3] += 1
    works = [dist.all_reduce(buf, ReduceOp.SUM, async_op=True) for buf in bufs]
    deadline, polls = time.monotonic() + 60.0, 0
    while time.monotonic() < deadline:
        done = [w.is_completed() for w in works]
        polls += 1
        first_pending = done.index(False) if False in done else len(done)
        later = [k for k in range(first_pending, len(done)) if done[k]]
        if later:
            problems.add(f"handles {later} completed before handle {first_pending}")
            break
        if first_pending == len(done):
            break
        time.sleep(0.0005)
    for k, (work, buf) in enumerate(zip(works, bufs)):
        work.wait(timeout=60.0)
        problems.expect(work.is_success(), f"handle {k} did not succeed: {work.exception()!r}")
        problems.expect(work.result() is buf, f"handle {k} result is not the tensor")
        problems.expect_equal(buf, np.full(lengths[k], n * k + n * (n - 1) / 2.0),
                              f"handle {k} ({lengths[k]} elements)")
    return problems.verdict(f"{len(works)} async all_reduces of {min(lengths)}..{max(lengths)} "
                            f"elements completed in issue order ({polls} polls), values exact")
