"""The public all-reduce, broadcast, barrier and all-gather into a tensor run from C
(``transports/entry_table``) on shm, on real processes: the same bits as the Python entries
(``NEURAL_ARCH_SHORT_C=0``) and as NumPy, every hot call of a typed array (1-D or not) and
barrier served by the C table and none by the Python entry, ranks on either path meeting, and
a mismatch, a late peer and a timeout handled as on the Python path."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from collective_references import expected_reduction, inputs_of
from dist_harness import RankFailed, run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.collectives import tensors
from neural_arch.distributed.transports import entry_table

pytest.importorskip("numba", reason="the compiled short calls need Numba")
if entry_table.Table is None:  # pragma: no cover - a machine without a C compiler
    pytest.skip("the C extension _entry_table was not built (no C compiler at install)",
                allow_module_level=True)
pytestmark = pytest.mark.timeout(90)
COMPILED = {"NEURAL_ARCH_SHM_SMALL": "compiled"}  # plans compiled from the first call
SUM, PRODUCT, AVERAGE = dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.AVERAGE
CASES = [(np.float32, SUM), (np.float32, AVERAGE), (np.float64, PRODUCT), (np.float64, AVERAGE),
         (np.int32, SUM), (np.int64, PRODUCT)]
SIZES = [0, 1, 3, 257]


def _count_python_entries() -> dict:
    """Wrap every Python entry of the all-reduce, broadcast and all-gather tables to count its
    calls."""
    counts = {"all_reduce": 0, "broadcast": 0, "all_gather": 0}
    for name in counts:
        table = getattr(tensors._short, name)
        for key, entry in list(table.items()):
            def counted(*arrays, entry=entry, name=name):
                counts[name] += 1
                return entry(*arrays)
            table[key] = counted
    return counts


def _sweep(rank, ws):
    """Every case, size and root three times: the first call of a shape makes its plan, the
    second its entries, the third is counted."""
    results = []

    def once():
        for dtype, op in CASES:
            for n in SIZES:
                for salt in range(2):
                    x = inputs_of(rank, n, dtype, op, salt)
                    dist.all_reduce(x if salt == 0 else x.reshape(-1, 1), op)  # (n, 1): a view
                    results.append(x.tolist())
        for root in range(ws):
            for dtype in (np.float32, np.int64, np.int32, np.float16):
                for n in SIZES:
                    b = np.full(n, rank * 10 + root, dtype)
                    dist.broadcast(b, root)
                    results.append(b.tolist())
        for dtype in (np.float64, np.int32, np.float16):
            for n in SIZES:
                src = np.arange(n, dtype=dtype) + rank
                out = np.full(n * ws, -1, dtype)
                # torch's stacked output, (ws, n), for one dtype: a view of the same memory
                dist.all_gather_into_tensor(out.reshape(ws, n) if dtype is np.int32 else out,
                                            src)
                results.append(out.tolist())
        dist.barrier()
    once(), once()
    for _ in range(40):  # the compiled barrier's entry comes at its HOT_CALLS-th call
        dist.barrier()
    barrier = tensors._short.barrier
    counts = _count_python_entries()
    counts["barrier"] = 0

    def counted_barrier():
        counts["barrier"] += 1
        return barrier()
    tensors._short.barrier = counted_barrier
    assert len(tensors._short.all_reduce) == len(CASES) * len(SIZES), tensors._short.all_reduce
    results.clear()
    once()
    short = tensors._short
    used = None if short.c_tables is None else [t.used for t in short.c_tables]
    return results, counts, used


@pytest.mark.parametrize("ws", [2, 3])
def test_c_and_python_entries_give_numpys_bits_and_c_serves_every_hot_vector(ws):
    by_c = run_ranks(_sweep, ws, "shm", env={**COMPILED, entry_table.ENV_SWITCH: "1"})
    by_python = run_ranks(_sweep, ws, "shm", env={**COMPILED, entry_table.ENV_SWITCH: "0"})
    for rank in range(ws):
        c_results, c_counts, c_used = by_c[rank]
        py_results, py_counts, py_used = by_python[rank]
        assert c_results == py_results
        assert py_used is None and sum(py_counts.values()) > 0
        # float16 goes by bytes: its Python entries serve it
        assert c_counts == {"all_reduce": 0, "broadcast": ws * len(SIZES), "barrier": 0,
                            "all_gather": len(SIZES)}, c_counts
        assert py_counts["barrier"] == 1 and py_counts["all_gather"] == 3 * len(SIZES)
        assert c_used[0] >= len(CASES) * len(SIZES) and c_used[1] >= ws * 3 * len(SIZES)
        assert c_used[2] == 1 and c_used[3] >= 2 * len(SIZES)
    expected = []
    for dtype, op in CASES:
        for n in SIZES:
            for salt in range(2):
                expected.append(expected_reduction(ws, n, dtype, op, salt).tolist())
    for root in range(ws):
        for dtype in (np.float32, np.int64, np.int32, np.float16):
            for n in SIZES:
                expected.append(np.full(n, root * 10 + root, dtype).tolist())
    for dtype in (np.float64, np.int32, np.float16):
        for n in SIZES:
            expected.append(np.concatenate([np.arange(n, dtype=dtype) + r
                                            for r in range(ws)]).tolist())
    assert by_c[0][0] == expected


def _watch_c_calls(name: str = "all_reduce_now") -> list:
    """Record each call the C table ``name`` was asked: True (served), False (declined), or
    "raised"."""
    short, asked = tensors._short, []
    run = getattr(short, name)

    def watched(*args):
        asked.append("raised")
        asked[-1] = run(*args)
        return asked[-1]
    setattr(short, name, watched)
    return asked


def _mixed_then_late_then_mismatched(rank, ws):
    from neural_arch.distributed.group.world import resolve_group
    x = np.zeros(4, np.float32)
    src, out = np.zeros(3, np.float64), np.zeros(3 * ws, np.float64)
    for _ in range(3):  # the entries of this all-reduce and this all-gather, on every rank
        dist.all_reduce(x, SUM), dist.all_gather_into_tensor(out, src)
    asked, gathers = _watch_c_calls(), _watch_c_calls("all_gather_now")
    mixed, short = [], tensors._short
    for i in range(4):  # rank 0 from C (2-D), the others through the Python entry (1-D)
        y = np.full(4, rank + i, np.float32)
        if rank == 0:
            dist.all_reduce(y.reshape(2, 2), SUM)
        else:
            watched, short.all_reduce_now = short.all_reduce_now, entry_table.declined
            dist.all_reduce(y, SUM)
            short.all_reduce_now = watched
        mixed.append(y.tolist())
    if rank == 1:
        time.sleep(0.3)  # rank 0's kernel gives up polling: its finish waits
    late = np.full(4, rank + 1.0, np.float32)
    dist.all_reduce(late, SUM)
    if rank == 0:
        time.sleep(0.3)  # rank 1's all-gather waits, settled by the kernel on bytes
    src[:] = rank + 0.5
    dist.all_gather_into_tensor(out, src)
    try:
        if rank == 0:
            dist.all_gather_into_tensor(out, src)
        else:
            dist.all_reduce(x, SUM)
        message = "no error"
    except dist.CollectiveMismatchError as exc:
        message = str(exc)
    lock_free = resolve_group(None).queue.exec_lock.acquire(blocking=False)
    return mixed, late.tolist(), out.tolist(), message, lock_free, asked, gathers


def test_c_and_python_ranks_meet_late_peers_are_waited_for_a_mismatch_is_named():
    ws = 2
    results = run_ranks(_mixed_then_late_then_mismatched, ws, "shm", env=COMPILED)
    for rank, (mixed, late, gathered, message, lock_free, asked, gathers) in enumerate(results):
        assert mixed == [[float(sum(r + i for r in range(ws)))] * 4 for i in range(4)]
        assert late == [3.0] * 4 and gathered == [0.5] * 3 + [1.5] * 3
        assert "all_gather" in message and "all_reduce:sum" in message, message
        assert lock_free
        # rank 0's mixed calls from C, the others' not asked there; the late calls and the
        # mismatched ones (rank 0: an all-gather, rank 1: an all-reduce) in C
        assert asked == [True] * (4 if rank == 0 else 0) + [True] + ["raised"] * rank, asked
        assert gathers == [True] + ["raised"] * (1 - rank), gathers


def _times_out(rank, ws):
    from neural_arch.distributed.group.world import resolve_group
    x = np.zeros(2, np.float64)
    for _ in range(3):
        dist.all_reduce(x)
    resolve_group(None).transport.timeout = 0.3  # read by every wait
    asked = _watch_c_calls()
    if rank == 1:
        time.sleep(1.0)  # past rank 0's timeout
        return None
    start = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.CollectiveTimeoutError as exc:
        return exc.op, time.monotonic() - start, asked
    return None


def test_a_timeout_in_a_c_call_is_named():
    op, waited, asked = run_ranks(_times_out, 2, "shm", env=COMPILED)[0]
    assert op == "all_reduce:sum" and 0.25 < waited < 0.95 and asked == ["raised"]


def _starts(rank, ws):
    return "started"


def test_a_bad_switch_fails_the_transports_start():
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(RankFailed, match="NEURAL_ARCH_SHORT_C='yes'"):
        run_ranks(_starts, 2, "shm", env={entry_table.ENV_SWITCH: "yes"})
    # it fails before a segment exists (it used to fail after, leaving one behind)
    assert not {n for n in set(os.listdir("/dev/shm")) - before if n.startswith("nf_")}
