"""The public all-reduce's rounds of recursive doubling on the mpi transport, each one compiled
call made once per shape (``MpiTransport.exchange_reduce_plan``, ``mpi_compiled``'s
``round_plan``, ``mpi_kernels.round_sum``): the bits of the rounds' grouping of the sums, on
ranks that run the compiled rounds and ranks that do not (a rank that folds in or hands over at
p = 3, one in the mpi4py form); the swaps counted (a round the plan's compiled call runs is
none); a late peer, a plan made before the kernels load, another fingerprint, another size
named.

Each rank re-joins the default group with its own ``NEURAL_ARCH_MPI_COMPILED`` (read as the
transport is made), then calls ``dist.all_reduce`` twice per case (a plan is made at a shape's
first call)."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from dist_harness import mpi_available, run_ranks
from neural_arch.distributed.transports import mpi_compiled

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")]
HAVE_NUMBA = importlib.util.find_spec("numba") is not None

# elements: one, odd, past the wire's packed 8 KiB (p = 2), and 64 KiB - 4 bytes of float32
# (the largest recursive doubling takes; as float64 it is the ring's); beyond two ranks a
# round's swap carries at most 8 KiB
SIZES = {2: (1, 7, 4099, 16383), 3: (1, 7, 1001), 4: (1, 3, 1001)}
DTYPES = (np.float32, np.float64, np.int32)
OPS = ("SUM", "AVERAGE", "MAX")


def _values(rank: int, size: int, dtype) -> np.ndarray:
    """Values whose sums round differently grouped otherwise: mixed magnitudes, signed zeros."""
    rng = np.random.default_rng([rank, size, np.dtype(dtype).num])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size).astype(dtype)
    x = (rng.standard_normal(size) * 10.0 ** rng.integers(-4, 4, size)).astype(dtype)
    x[:2] = (0.0, -0.0)[:size] if rank % 2 else (-0.0, -0.0)[:size]
    return x


def _expected(world: int, size: int, dtype, op: str) -> np.ndarray:
    """The rounds' result in their operand order: at p = 2 x0 + x1, at p = 3 (x0 + x1) + x2
    (rank 1 folds rank 0's in first), at p = 4 (x0 + x1) + (x2 + x3); a mean divided after."""
    x = [_values(r, size, dtype) for r in range(world)]
    if op == "MAX":
        return np.maximum.reduce(x)
    total = {2: lambda: x[0] + x[1], 3: lambda: (x[0] + x[1]) + x[2],
             4: lambda: (x[0] + x[1]) + (x[2] + x[3])}[world]()
    if op == "AVERAGE":
        from neural_arch.distributed.reduce_ops import divide_by_count
        divide_by_count(total, world)
    return total


def _job(rank: int, world: int, forms: str) -> dict:
    import time
    from neural_arch import distributed as dist
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.errors import CollectiveMismatchError
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports import mpi
    from neural_arch.distributed.transports.base import Fingerprint
    dist.destroy_process_group()
    os.environ[mpi_compiled.ENV_CHOICE] = "compiled" if forms[rank] == "c" else "python"
    dist.init_process_group("mpi", timeout=20)
    t = resolve_group(None).transport
    dist.all_reduce(np.ones(3, np.int32))  # a swap: the compiled form loads (forms "c")
    report = {"why": mpi_compiled.why_not_compiled(), "wrong": [], "swaps": 0, "errors": []}
    swap, swaps = t.swap, []  # counted: a round run by the plan's compiled call is no swap
    t.swap = lambda *a: swaps.append(1) or swap(*a)
    np.seterr(over="ignore", invalid="ignore")
    for size in SIZES[world]:
        for dtype in DTYPES:
            for op in OPS:
                if op == "AVERAGE" and np.dtype(dtype).kind != "f":
                    continue
                expected, before = _expected(world, size, dtype, op), len(swaps)
                for _ in range(2):  # the first call of a shape makes its plan
                    buf = _values(rank, size, dtype)
                    dist.all_reduce(buf, getattr(dist.ReduceOp, op))
                    # a sum's bits; MAX's values (the ring above 64 KiB orders a zero's sign
                    # its own way)
                    if (buf.tobytes() != expected.tobytes() if op != "MAX"
                            else not np.array_equal(buf, expected)):
                        report["wrong"].append(f"{size} x {np.dtype(dtype).name} {op}")
                if _planned_case(world, size, dtype, op):
                    report["swaps"] += len(swaps) - before
    if world == 2:
        # a late peer, either one: the kernel hands the round to the wait, the fold runs after
        for late in (0, 1):
            buf = _values(rank, 7, np.float32)
            if rank == late:
                time.sleep(0.05)
            dist.all_reduce(buf, dist.ReduceOp.AVERAGE)
            report["late"] = report.get("late", []) + [
                buf.tobytes() == _expected(2, 7, np.float32, "AVERAGE").tobytes()]
        # a plan made before the kernels load runs its rounds as swaps, a mean divided too
        os.environ[mpi_compiled.ENV_CHOICE] = "auto"
        cold = mpi.create(timeout=20)
        buf = _values(rank, 7, np.float32)
        algorithms.all_reduce_plan(cold, buf.dtype, buf.nbytes, ReduceOp.AVERAGE)(
            buf, Fingerprint("all_reduce:avg", 1, "float32", 7))
        report["cold"] = buf.tobytes() == _expected(2, 7, np.float32, "AVERAGE").tobytes()
        cold.close()
        # a plan run with another caller's names sends them (the rank in the mpi4py form
        # packs its header from the fingerprint), and each call's seq
        plan = algorithms.all_reduce_plan(t, np.dtype(np.float64), 24, ReduceOp.SUM)
        calls = [("first", 100), ("second", 101)] + ([("second", 102 + rank)]
                                                     if forms == "cc" else [])
        try:
            for name, seq in calls:
                buf = np.ones(3)
                plan(buf, Fingerprint(name, seq, "float64", 3))
                report["named"] = report.get("named", []) + [buf.tolist()]
            if forms == "cp":  # another size on each rank
                dist.all_reduce(np.ones(5 + rank, np.float32))
        except CollectiveMismatchError as e:
            report["errors"].append(str(e))
    return report


def _planned_case(world: int, size: int, dtype, op: str) -> bool:
    """Whether ``_job``'s case runs recursive doubling with rounds a transport may prepare: a
    float SUM or AVERAGE below 64 KiB, within a round's swap (8 KiB beyond two ranks)."""
    limit = 64 << 10 if world == 2 else 8 << 10
    return (np.dtype(dtype).kind == "f" and op != "MAX"
            and size * np.dtype(dtype).itemsize < limit)


def _swaps(forms: str, rank: int) -> int:
    """The swaps a rank of ``_job`` makes in the planned cases: none where its rounds run as
    the plan's compiled calls (a compiled rank that only doubles); else one per round of
    recursive doubling (one at p = 2, two at p = 4; at p = 3 rank 0 hands its vector over,
    rank 1 folds it in and doubles with rank 2), on both calls of SUM and AVERAGE."""
    world = len(forms)
    if forms[rank] == "c" and not (world == 3 and rank < 2):
        return 0
    rounds = {2: 1, 4: 2}.get(world, 0 if rank == 0 else 1)
    cases = sum(_planned_case(world, size, dtype, "SUM") for size in SIZES[world]
                for dtype in DTYPES)
    return rounds * 2 * 2 * cases


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled rounds need Numba (the 'fast' extra)")
@pytest.mark.parametrize("forms", ["cc", "cp", "ccc", "cccp"])
def test_public_all_reduce_rounds_keep_their_bits_on_either_form(forms):
    world = len(forms)
    per_rank = run_ranks(_job, world, "mpi", timeout=90, args=(forms,),
                         init_kwargs={"timeout": 20})
    for rank, r in enumerate(per_rank):
        assert (r["why"], r["wrong"]) == ("", []), (rank, r)
        assert r["swaps"] == _swaps(forms, rank), (rank, r)
    for r in per_rank if world == 2 else ():
        assert (r["late"], r["cold"]) == ([True, True], True), r
        assert r["named"] == [[2.0, 2.0, 2.0]] * 2, r
        named = ("second #102", "second #103") if forms == "cc" else ("5 x float32",
                                                                       "6 x float32")
        assert any(all(n in e for n in named) for e in r["errors"]), r
