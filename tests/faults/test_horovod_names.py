"""Horovod's named operations are matched by name, not by the order the ranks submit them.

Every rank submits the same named async operations in a different order (a different
permutation on every rank, at 2 and 3 ranks): each result must equal the NumPy reference for
its name, never a sum of two different tensors. A name one rank never submits is an error on
every rank, within the stall timeout, that names it, the ranks that submitted it and the rank
that did not; so are an unnamed operation run while the others wait for a name, one name for
two operations or two sizes, and a name submitted twice. Named and unnamed operations mix
(unnamed ones keep their call order), and ranks inside ``hvd.join()`` answer named operations
of the ranks still training. (DistributedOptimizer's names: tests/horovod.)
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from dist_harness import run_ranks
from horovod_names_job import data, missing_name, rows

pytestmark = pytest.mark.timeout(120)
STALL_S = 1.0  # HOROVOD_STALL_SHUTDOWN_TIME_SECONDS in these jobs
STALL_ENV = {"HOROVOD_STALL_SHUTDOWN_TIME_SECONDS": str(STALL_S)}
COLLECTIVE_TIMEOUT_S = 20.0  # what a rank would wait for a collective that is not coming
NAMES = ("a", "b", "c")
ORDERS = {2: [(0, 1, 2), (2, 1, 0)], 3: [(0, 1, 2), (1, 2, 0), (2, 1, 0)]}


def run(case, world: int, backend: str = "shm", args: tuple = ()) -> list:
    return run_ranks(case, world, backend, timeout=90, args=args, env=STALL_ENV,
                     init_kwargs={"timeout": COLLECTIVE_TIMEOUT_S})


# ----- submission order ---------------------------------------------------------------------
def permuted_allreduces(rank: int, world: int) -> dict:
    import neural_arch.horovod as hvd
    hvd.init()
    order = [NAMES[i] for i in ORDERS[world][rank]]
    handles = {name: hvd.allreduce_async(data(name, rank), name=name, op=hvd.Sum)
               for name in order}
    # rank 0 waits in its submission order, the others in the reverse one
    waits = order if rank == 0 else order[::-1]
    out = {name: hvd.synchronize(handles[name]) for name in waits}
    hvd.shutdown()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_named_allreduces_submitted_in_different_orders_match_by_name(world):
    results = run(permuted_allreduces, world)
    for rank, out in enumerate(results):
        for name in NAMES:
            want = sum(data(name, r) for r in range(world))
            np.testing.assert_allclose(out[name], want, rtol=1e-12,
                                       err_msg=f"rank {rank}, name {name!r}")


def permuted_kinds(rank: int, world: int) -> dict:
    """An allreduce, an in-place allreduce, an allgather and a broadcast, each named, in a
    different order on every rank."""
    import neural_arch.horovod as hvd
    hvd.init()
    inplace = data("inplace", rank)
    submit = {
        "sum": lambda: hvd.allreduce_async(data("sum", rank), name="sum", op=hvd.Sum),
        "inplace": lambda: hvd.allreduce_async_(inplace, name="inplace"),
        "gather": lambda: hvd.allgather_async(rows(rank), name="gather"),
        "bcast": lambda: hvd.broadcast_async(data("bcast", rank), world - 1, name="bcast"),
    }
    order = list(submit)
    order = order[rank:] + order[:rank]  # a rotation per rank
    if rank % 2:
        order.reverse()
    handles = {name: submit[name]() for name in order}
    while not hvd.poll(handles[order[-1]]):  # every rank polls: the first poll negotiates
        time.sleep(0.001)
    out = {name: hvd.synchronize(handles[name]) for name in sorted(handles)}
    out["inplace_is_input"] = out["inplace"] is inplace
    hvd.shutdown()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_named_allgather_broadcast_allreduce_in_different_orders(world):
    results = run(permuted_kinds, world)
    for rank, out in enumerate(results):
        np.testing.assert_allclose(out["sum"], sum(data("sum", r) for r in range(world)),
                                   rtol=1e-12)
        np.testing.assert_allclose(out["inplace"],
                                   sum(data("inplace", r) for r in range(world)) / world,
                                   rtol=1e-12)
        assert out["inplace_is_input"]
        np.testing.assert_array_equal(out["gather"],
                                      np.concatenate([rows(r) for r in range(world)]))
        np.testing.assert_array_equal(out["bcast"], data("bcast", world - 1))


def permuted_on_every_transport(rank: int, world: int) -> dict:
    return permuted_allreduces(rank, world)


def test_named_allreduces_in_different_orders_on_every_transport(backend):
    results = run(permuted_on_every_transport, 3, backend)
    for out in results:
        for name in NAMES:
            np.testing.assert_allclose(out[name], sum(data(name, r) for r in range(3)),
                                       rtol=1e-12)


# ----- a name one rank never submits --------------------------------------------------------
def test_a_name_missing_on_one_rank_is_named_on_every_rank_within_the_timeout():
    results = run(missing_name, 3, args=(1,))
    for rank, out in enumerate(results):
        message = out["error"]
        assert message is not None, f"rank {rank} returned without an error"
        assert "'a'" in message and "submitted by ranks [0, 2]" in message, message
        assert "missing on rank [1]" in message, message
        assert "HOROVOD_STALL_SHUTDOWN_TIME_SECONDS" in message, message
        # told by the stall limit, not by a collective's timeout (the first negotiations
        # also pay for compiling the transport's collectives)
        assert STALL_S <= out["seconds"] < COLLECTIVE_TIMEOUT_S, out


def missing_then_unnamed(rank: int, world: int) -> str:
    """Rank 1 never submits "a" and runs an unnamed allreduce while the others wait for it."""
    import neural_arch.horovod as hvd
    hvd.init()
    try:
        if rank == 1:
            hvd.allreduce(np.ones(2))
        else:
            hvd.synchronize(hvd.allreduce_async(np.ones(2), name="a"))
        return "no error"
    except RuntimeError as exc:
        return str(exc)
    finally:
        hvd.shutdown()


def test_an_unnamed_operation_while_the_others_wait_for_a_name_raises_on_every_rank():
    for message in run(missing_then_unnamed, 3):
        assert "ranks disagree on the kind of a Horovod operation" in message, message
        assert ("rank 0 negotiation of named operations, rank 1 allreduce, "
                "rank 2 negotiation of named operations") in message, message


def one_name_two_meanings(rank: int, world: int) -> list:
    """Under "x" rank 0 all-reduces and rank 1 broadcasts; under "y" the sizes differ."""
    import neural_arch.horovod as hvd
    hvd.init()
    messages = []
    calls = [lambda: (hvd.allreduce(np.ones(2), name="x") if rank == 0
                      else hvd.broadcast(np.ones(2), 0, name="x")),
             lambda: hvd.allreduce(np.ones(2 + rank), name="y")]
    for call in calls:
        try:
            call()
            messages.append("no error")
        except RuntimeError as exc:
            messages.append(str(exc))
    hvd.shutdown()
    return messages


def test_one_name_for_different_operations_or_shapes_is_named_on_every_rank():
    for kinds, sizes in run(one_name_two_meanings, 2):
        assert "different Horovod operations under one name: 'x': rank 0 allreduce, " \
               "rank 1 broadcast" in kinds, kinds
        assert "(name='y')" in sizes and "ranks disagree on the count" in sizes, sizes


def duplicate_name(rank: int, world: int) -> str:
    import neural_arch.horovod as hvd
    hvd.init()
    first = hvd.allreduce_async(np.ones(2), name="twice")
    try:
        hvd.allreduce_async(np.ones(2), name="twice")
        message = "no error"
    except ValueError as exc:
        message = str(exc)
    hvd.synchronize(first)
    hvd.synchronize(hvd.allreduce_async(np.ones(2), name="twice"))  # free again once done
    hvd.shutdown()
    return message


def test_a_name_submitted_twice_while_pending_is_refused():
    for message in run(duplicate_name, 2):
        assert "'twice'" in message and "already pending" in message, message


# ----- named and unnamed together; join ----------------------------------------------------
def mixed_named_unnamed(rank: int, world: int) -> dict:
    import neural_arch.horovod as hvd
    hvd.init()
    order = [NAMES[i] for i in ORDERS[world][rank]]
    handles, out = {}, {}
    handles[order[0]] = hvd.allreduce_async(data(order[0], rank), name=order[0], op=hvd.Sum)
    out["x"] = hvd.allreduce(data("x", rank), op=hvd.Sum)  # unnamed, at once
    handles[order[1]] = hvd.allreduce_async(data(order[1], rank), name=order[1], op=hvd.Sum)
    unnamed = hvd.allgather_async(rows(rank))
    handles[order[2]] = hvd.allreduce_async(data(order[2], rank), name=order[2], op=hvd.Sum)
    out.update({name: hvd.synchronize(h) for name, h in handles.items()})
    out["rows"] = hvd.synchronize(unnamed)
    hvd.shutdown()
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_named_and_unnamed_operations_mix(world):
    for out in run(mixed_named_unnamed, world):
        for name in NAMES + ("x",):
            np.testing.assert_allclose(out[name], sum(data(name, r) for r in range(world)),
                                       rtol=1e-12, err_msg=name)
        np.testing.assert_array_equal(out["rows"],
                                      np.concatenate([rows(r) for r in range(world)]))


def join_with_names(rank: int, world: int, steps: list) -> dict:
    """Rank r trains ``steps[r]`` steps, each submitting the named "a", "b", "c" in its own
    order; then it submits "tail" and joins before waiting for it."""
    import neural_arch.horovod as hvd
    hvd.init()
    order = [NAMES[i] for i in ORDERS[world][rank]]
    sums = []
    for step in range(steps[rank]):
        handles = {n: hvd.allreduce_async(data(n, rank) + step, name=n, op=hvd.Sum)
                   for n in order}
        sums.append({n: hvd.synchronize(h) for n, h in handles.items()})
        sums[-1]["mean"] = hvd.allreduce(np.array([float(rank)]), name="mean")
    tail = hvd.allreduce_async(data("tail", rank), name="tail", op=hvd.Sum)
    last = hvd.join()
    out = {"sums": sums, "last": last, "tail": hvd.synchronize(tail)}
    hvd.shutdown()
    return out


def test_join_answers_named_operations_of_the_ranks_still_training():
    steps = [3, 1, 2]
    results = run(join_with_names, 3, args=(steps,))
    for rank, out in enumerate(results):
        assert out["last"] == 0
        assert len(out["sums"]) == steps[rank]
        for step, got in enumerate(out["sums"]):
            active = [r for r in range(3) if step < steps[r]]
            for name in NAMES:
                want = sum(data(name, r) + step for r in active)  # joined ranks add zeros
                np.testing.assert_allclose(got[name], want, rtol=1e-12)
            np.testing.assert_allclose(got["mean"], [np.mean(active)], rtol=1e-12)
        # every rank submitted "tail" before joining: all three contribute
        np.testing.assert_allclose(out["tail"], sum(data("tail", r) for r in range(3)),
                                   rtol=1e-12)
