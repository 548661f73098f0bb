"""The short paths of ``all_reduce``, ``broadcast`` and ``all_gather_into_tensor`` (NumPy
arrays, default group,
synchronous, no profiler) against the general path and NumPy, on real processes; and the calls
they must leave alone."""
from __future__ import annotations

from collections import Counter
from contextlib import contextmanager

import numpy as np
import pytest

from collective_references import DTYPES, OPS, expected_reduction, inputs_of
from dist_harness import installed_backends, run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.collectives import tensors
from neural_arch.distributed.profiler import CommunicationProfiler, trace_collectives

pytestmark = pytest.mark.timeout(120)


@contextmanager
def _general_calls():
    """The names of the public calls that took the general path inside the block. Its first
    step, ``usable_group`` as ``collectives.tensors`` calls it, is counted: no entry or plan
    calls it, whereas an entry may call the same algorithm the general path calls."""
    general, names = tensors.usable_group, []

    def counting(group, op):
        names.append(op)
        return general(group, op)
    tensors.usable_group = counting
    try:
        yield names
    finally:
        tensors.usable_group = general


def _twice_counting_general_calls(sweep) -> tuple[Counter, Counter]:
    """Run ``sweep()`` twice; return how many of each sweep's calls took the general path,
    by name. A call that ran its shape's entry or plan never does; on shared memory a plan
    exists only once an earlier call of the shape made it."""
    counts = []
    for _ in range(2):
        with _general_calls() as names:
            sweep()
        counts.append(Counter(names))
    return counts[0], counts[1]


def _values(rank: int, shape, dtype, op) -> np.ndarray:
    return inputs_of(rank, int(np.prod(shape)), dtype, op).reshape(shape)


def _expected(ws: int, shape, dtype, op) -> np.ndarray:
    return expected_reduction(ws, int(np.prod(shape)), dtype, op).reshape(shape)


def _every_op_and_dtype(rank, ws):
    def sweep():
        for dtype in DTYPES:
            for op in OPS:
                if op is dist.ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                    continue
                for shape in [(0,), (1,), (ws - 1,), (7,), (3, 5), (2, 3, 4)]:
                    x = _values(rank, shape, dtype, op)
                    assert dist.all_reduce(x, op) is x
                    np.testing.assert_array_equal(x, _expected(ws, shape, dtype, op),
                                                  err_msg=f"{dtype} {op} {shape}")
        dist.barrier()
    return _twice_counting_general_calls(sweep)


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize("ws", [2, 3])
def test_every_op_dtype_and_shape_matches_numpy(backend, ws):
    combos = 3 * 5 + 2 * 4  # AVERAGE only for the float dtypes
    sizes = combos * len({0, 1, ws - 1, 7, 15, 24})  # 6 shapes
    for first, second in run_ranks(_every_op_and_dtype, ws, backend, timeout=90):
        if backend == "shm":
            # each size's first call made its plan, and the second sweep ran every call's
            # plan directly (the barrier's entry comes after HOT_CALLS barriers, or at once
            # when compiling is forced: ``test_short_calls``)
            assert (first["all_reduce"], second["all_reduce"]) == (sizes, 0)
            assert set(first) | set(second) <= {"all_reduce", "barrier"}
        else:
            # the first call of each shape made its entry and ran through it, as every later
            # one did; the barrier's too
            assert (first, second) == (Counter(), Counter())


def _calls_it_leaves_to_the_general_path(rank, ws):
    from neural_arch.core.tensor import Tensor
    seen = []
    # a strided view: staged through a contiguous copy, written back
    base = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
    dist.all_reduce(base[:, ::2])
    seen.append(base.tolist())
    # a read-only array is refused with the general path's error
    frozen = np.ones(3)
    frozen.flags.writeable = False
    try:
        dist.all_reduce(frozen)
    except ValueError as exc:
        seen.append("read-only" in str(exc))
    # unsupported dtype and an op given by name
    try:
        dist.all_reduce(np.zeros(2, np.uint8))
    except TypeError as exc:
        seen.append("uint8" in str(exc))
    by_name = np.full(2, rank + 1.0)
    dist.all_reduce(by_name, "max")
    seen.append(by_name.tolist())
    # async work queued before a plain call runs first
    first, second = np.full(4, rank + 1.0), np.full(4, 10.0 * (rank + 1))
    work = dist.all_reduce(first, async_op=True)
    dist.all_reduce(second)
    work.wait(30)
    seen.append((first.tolist(), second.tolist()))
    # with a profiler attached the call is traced
    profiler = CommunicationProfiler()
    with trace_collectives(profiler):
        dist.all_reduce(np.ones(5, np.float32))
    seen.append(profiler.get_statistics()["all_reduce"]["count"])
    # rank 0 takes the general path (a Tensor; an async barrier), the others their shape's
    # entry, made by the call before: both number the call alike, or its messages mismatch
    again = np.full(3, rank + 1.0)
    dist.all_reduce(again)
    mixed = Tensor(np.full(3, rank + 1.0)) if rank == 0 else np.full(3, rank + 1.0)
    with _general_calls() as general:
        out = dist.all_reduce(mixed)
        if rank == 0:
            dist.barrier(async_op=True).wait(30)
        else:
            dist.barrier()
        dist.all_reduce(again)
    seen.append(((out.array if rank == 0 else out).tolist(), again.tolist(), general))
    return seen


def _check_all_reduces_left_alone(backend: str, ws: int, rank: int, seen: list) -> None:
    total = ws * (ws + 1) // 2
    base = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
    base[:, ::2] = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2] * total
    assert seen[0] == base.tolist()
    assert seen[1] is True and seen[2] is True
    assert seen[3] == [float(ws)] * 2
    assert seen[4] == ([float(total)] * 4, [10.0 * total] * 4)
    assert seen[5] == 1
    mixed, again, general = seen[6]
    assert (mixed, again) == ([float(total)] * 3, [float(total * ws)] * 3)
    if rank == 0:
        assert general == ["all_reduce", "barrier"]
    else:  # on shared memory the barrier's entry may not exist yet (``test_short_calls``)
        assert [name for name in general if backend != "shm" or name != "barrier"] == []


def _left_to_the_general_path(rank, ws):
    return (_calls_it_leaves_to_the_general_path(rank, ws),
            _broadcasts_left_to_the_general_path(rank, ws))


# One job per backend runs the all-reduces and broadcasts the short paths leave alone (and
# shared memory's at three ranks as well); the two tests below read its results.
_LEFT_ALONE_JOBS = [(backend, 2) for backend in installed_backends()] + [
    ("shm", 3) for backend in installed_backends() if backend == "shm"]


@pytest.fixture(scope="module", params=_LEFT_ALONE_JOBS, ids=lambda job: f"{job[0]}-{job[1]}")
def left_alone(request):
    backend, ws = request.param
    return backend, ws, run_ranks(_left_to_the_general_path, ws, backend, timeout=90)


def test_calls_the_short_path_leaves_alone_still_work(left_alone):
    backend, ws, results = left_alone
    for rank, (seen, _) in enumerate(results):
        _check_all_reduces_left_alone(backend, ws, rank, seen)


def _prepared_calls(rank, ws):
    """How many short-path all-reduces went through ``algorithms.all_reduce`` (the rest ran
    the prepared form straight away), and their results."""
    from neural_arch.distributed import algorithms
    general = algorithms.all_reduce
    routed = []

    def counting(*args, **kwargs):
        routed.append(args[1].size)
        return general(*args, **kwargs)
    algorithms.all_reduce = counting
    try:
        sums = []
        for i in range(5):
            for n in (3, 300_000):  # small vectors are prepared; large ones go straight to
                # the transport's collective (an entry from their first call)
                x = np.full(n, float(rank + i), np.float32)
                dist.all_reduce(x)
                sums.append(float(x[0]))
        return routed, sums
    finally:
        algorithms.all_reduce = general


@pytest.mark.parametrize("env,routed", [({}, [3]),
                                        ({"NEURAL_ARCH_ALLREDUCE_ALGO": "ring"}, [3, 300_000] * 5)])
def test_prepared_small_all_reduces_skip_the_algorithm_layer(env, routed):
    """After the first call of a shape, a small all-reduce on shm runs its prepared form, and
    a large one calls the transport's all-reduce from the first; an algorithm named in the
    environment sends every call through the selection again."""
    for seen, sums in run_ranks(_prepared_calls, 2, "shm", env=env):
        assert seen == routed
        assert sums == [2.0 * i + 1 for i in range(5) for _ in (3, 300_000)]


def _mismatched_ops(rank, ws):
    op = dist.ReduceOp.SUM if rank == 0 else dist.ReduceOp.MAX
    try:
        dist.all_reduce(np.ones(3, np.float32), op)
    except dist.CollectiveMismatchError as exc:
        return str(exc)
    return "no error"


# Not tcp: there the rank that finds the mismatch first may leave, closing its connection,
# before its peer read the header it was sent (the peer then reports a lost connection).
@pytest.mark.parametrize("backend", [b for b in installed_backends() if b != "tcp"])
def test_ranks_calling_different_ops_raise_naming_both(backend):
    for message in run_ranks(_mismatched_ops, 2, backend, timeout=60):
        assert "all_reduce:sum" in message and "all_reduce:max" in message, message


def _entries_end_with_their_group(rank, ws):
    """A transport without short calls of its own (mpi) gets the general entries: one per
    shape, gone once the group is destroyed, made afresh for the next group."""
    from neural_arch.distributed.collectives import tensors
    x = np.full(3, rank + 1.0, np.float32)
    dist.all_reduce(x)
    dist.all_reduce(x)
    made = sorted(tensors._short.all_reduce)
    dist.destroy_process_group()
    left = len(tensors._short.all_reduce)
    dist.init_process_group(backend="mpi", timeout=30)
    y = np.full(3, rank + 1.0, np.float32)
    dist.all_reduce(y)
    return [str(k) for k in made], left, len(tensors._short.all_reduce), x.tolist(), y.tolist()


@pytest.mark.skipif("mpi" not in installed_backends(), reason="mpi4py or mpiexec not installed")
def test_general_entries_end_with_their_group():
    for made, left, remade, first, second in run_ranks(_entries_end_with_their_group, 2, "mpi",
                                                      timeout=60):
        assert made == [str((np.dtype(np.float32), 3, dist.ReduceOp.SUM))]
        assert (left, remade) == (0, 1)
        assert first == [6.0] * 3 and second == [3.0] * 3  # (1 + 2) twice, then once


# ----- broadcast ------------------------------------------------------------------------------
def _broadcast_every_dtype_shape_and_root(rank, ws):
    def sweep():
        for dtype in DTYPES:
            for shape in [(0,), (1,), (ws - 1,), (7,), (3, 5), (2, 3, 4)]:
                for root in range(ws):
                    x = (np.arange(int(np.prod(shape))) * (rank + 1) + rank).astype(dtype)
                    x = x.reshape(shape)
                    assert dist.broadcast(x, root) is x
                    want = (np.arange(x.size) * (root + 1) + root).astype(dtype).reshape(shape)
                    np.testing.assert_array_equal(x, want, err_msg=f"{dtype} {shape} root {root}")
    return _twice_counting_general_calls(sweep)


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize("ws", [2, 3])
def test_broadcast_of_every_dtype_shape_and_root_matches_the_root(backend, ws):
    calls = len(DTYPES) * 6 * ws
    for first, second in run_ranks(_broadcast_every_dtype_shape_and_root, ws, backend,
                                   timeout=90):
        assert set(first) | set(second) <= {"broadcast"}
        if backend == "shm":
            # plans are keyed by bytes and root: equal byte counts of another dtype share one
            assert 0 < first["broadcast"] <= calls and second["broadcast"] == 0
        else:  # the first call of each shape made its entry and ran through it
            assert (first["broadcast"], second["broadcast"]) == (0, 0)


def _broadcasts_left_to_the_general_path(rank, ws):
    from neural_arch.core.tensor import Tensor
    seen = []
    base = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
    dist.broadcast(base[:, ::2], 1)  # strided: staged through a copy, written back
    seen.append(base.tolist())
    frozen = np.full(3, float(rank))  # read-only: fine on the root, refused elsewhere
    frozen.flags.writeable = rank != 0
    dist.broadcast(frozen, 0)
    seen.append(frozen.tolist())
    if rank != 0:  # refused before any message, so the root need not take part
        frozen.flags.writeable = False
        try:
            dist.broadcast(frozen, 0)
        except ValueError as exc:
            seen[-1] = ("read-only" in str(exc), seen[-1])
    for bad in (True, ws, -1):  # a bool, or a rank out of range: the general path's error
        try:
            dist.broadcast(np.zeros(2), bad)
        except (TypeError, ValueError) as exc:
            seen.append(type(exc).__name__)
    numpy_root = np.full(2, rank + 1.0)  # a NumPy integer rank is accepted, as in PyTorch
    dist.broadcast(numpy_root, np.int64(ws - 1))
    seen.append(numpy_root.tolist())
    # one rank passes a Tensor (general path), the others an array (their shape's entry):
    # both number the call alike, or its messages mismatch
    mixed = Tensor(np.full(3, rank + 5.0)) if rank == 0 else np.full(3, rank + 5.0)
    with _general_calls() as general:
        out = dist.broadcast(mixed, 0)
    seen.append(((out.array if rank == 0 else out).tolist(), general))
    return seen


def test_broadcasts_the_short_path_leaves_alone_still_work(left_alone):
    _, ws, results = left_alone
    for rank, (_, seen) in enumerate(results):
        base = np.arange(12, dtype=np.float64).reshape(3, 4) * (rank + 1)
        base[:, ::2] = np.arange(12, dtype=np.float64).reshape(3, 4)[:, ::2] * 2
        assert seen[0] == base.tolist()
        assert seen[1] == ([0.0] * 3 if rank == 0 else (True, [0.0] * 3))
        assert seen[2:5] == ["TypeError", "ValueError", "ValueError"]
        assert seen[5] == [float(ws)] * 2
        assert seen[6] == ([5.0] * 3, ["broadcast"] if rank == 0 else [])


# ----- all_gather_into_tensor -----------------------------------------------------------------
def _all_gather_every_dtype_and_shape(rank, ws):
    def sweep():
        for dtype in DTYPES:
            for shape in [(0,), (1,), (ws - 1,), (7,), (3, 5), (2, 3, 4)]:
                x = (np.arange(int(np.prod(shape))) * (rank + 1) + rank).astype(dtype)
                x = x.reshape(shape)
                out = np.full((ws,) + shape, -1, dtype)
                assert dist.all_gather_into_tensor(out, x) is out
                want = np.stack([(np.arange(x.size) * (r + 1) + r).astype(dtype).reshape(shape)
                                 for r in range(ws)])
                np.testing.assert_array_equal(out, want, err_msg=f"{dtype} {shape}")
                flat_out = np.full(ws * x.size, -1, dtype)  # a 1-D output of ws x size elements
                dist.all_gather_into_tensor(flat_out, x)
                np.testing.assert_array_equal(flat_out, want.reshape(-1))
    return _twice_counting_general_calls(sweep)


@pytest.mark.parametrize("backend", installed_backends())
@pytest.mark.parametrize("ws", [2, 3])
def test_all_gather_into_tensor_of_every_dtype_and_shape_matches_numpy(backend, ws):
    for first, second in run_ranks(_all_gather_every_dtype_and_shape, ws, backend, timeout=90):
        assert set(first) | set(second) <= {"all_gather_into_tensor"}
        # shared memory plans a shape after its first call; elsewhere an entry runs the first
        assert first["all_gather_into_tensor"] == (
            len(DTYPES) * len({0, 1, ws - 1, 7, 15, 24}) if backend == "shm" else 0)
        assert second["all_gather_into_tensor"] == 0


def _all_gathers_left_to_the_general_path(rank, ws):
    from neural_arch.core.tensor import Tensor
    seen = []
    out = np.zeros((ws, 4))
    dist.all_gather_into_tensor(out[:, ::-1], np.full(4, rank + 1.0))  # strided output
    seen.append(out[:, 0].tolist())
    wide = np.zeros((ws, 8))
    dist.all_gather_into_tensor(out, wide[0, ::2] + rank)  # strided input (a copy here)
    seen.append(out[:, 0].tolist())
    frozen = np.zeros((ws, 2))
    frozen.flags.writeable = False
    for bad_out, exc_type in ((frozen, ValueError), (np.zeros(ws * 2 + 1), ValueError),
                              (np.zeros(ws * 2, np.float32), ValueError),
                              (np.zeros(ws * 2, np.uint8), TypeError)):
        try:  # refused before any message: the general path's errors
            dist.all_gather_into_tensor(bad_out, np.zeros(2))
            seen.append("no error")
        except exc_type as exc:
            seen.append(type(exc).__name__)
    # one rank passes a Tensor (general path), the others arrays (short path): they agree
    source = Tensor(np.full(2, rank + 1.0)) if rank == 0 else np.full(2, rank + 1.0)
    gathered = np.zeros((ws, 2))
    dist.all_gather_into_tensor(gathered, source)
    seen.append(gathered[:, 0].tolist())
    # async work queued before a plain call runs first
    first, second = np.full(3, rank + 1.0), np.zeros(ws * 3)
    work = dist.all_reduce(first, async_op=True)
    dist.all_gather_into_tensor(second, np.full(3, 10.0 * (rank + 1)))
    work.wait(30)
    seen.append((first.tolist(), second[::3].tolist()))
    return seen


@pytest.mark.parametrize("backend", installed_backends())
def test_all_gathers_the_short_path_leaves_alone_still_work(backend):
    ws = 3
    ranks = [float(r + 1) for r in range(ws)]
    for seen in run_ranks(_all_gathers_left_to_the_general_path, ws, backend):
        assert seen[0] == ranks
        assert seen[1] == [0.0, 1.0, 2.0]
        assert seen[2:6] == ["ValueError", "ValueError", "ValueError", "TypeError"]
        assert seen[6] == ranks
        assert seen[7] == ([float(sum(range(1, ws + 1)))] * 3, [10.0 * r for r in ranks])
