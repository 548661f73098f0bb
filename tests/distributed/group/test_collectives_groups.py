"""The other algorithms of each collective, async issue order and subgroups, on real processes.

Every algorithm that can run on a backend is forced in turn for broadcast, all-gather,
reduce-scatter and barrier; at world size 4 every collective also runs on subgroups of three
ranks (one without rank 0), and non-members must be refused. References as in
``test_collectives_multiprocess``.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from collective_references import (FORCED_OTHERS, INIT, LARGE, expected_over, forced, inputs_of,
                                   ops_for)
from dist_harness import run_ranks
from neural_arch import distributed as dist

pytestmark = pytest.mark.timeout(300)


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
    if ws == 4:
        # proper subgroups of three ranks, one without rank 0: their ring runs on GroupTransport
        for members in ([0, 1, 3], [1, 2, 3]):
            group = dist.new_group(members)
            if rank in members:
                subgroup_member_checks(rank, group, members)
            else:
                subgroup_outsider_checks(rank, group)
    # the world group still works, and its sequence numbers were not disturbed
    x = np.ones(3)
    dist.all_reduce(x)
    np.testing.assert_array_equal(x, np.full(3, ws))
    return True


def subgroup_member_checks(rank: int, group, members: list) -> None:
    """Every collective on a group of three of four ranks; src/dst are global ranks."""
    n, me = len(members), members.index(rank)
    assert (dist.get_rank(group), dist.get_world_size(group)) == (me, n)
    for root in members:
        for dtype in (np.float32, np.int64):
            for op in ops_for(dtype):
                x = inputs_of(rank, 13, dtype, op, salt=root)
                assert dist.reduce(x, dst=root, op=op, group=group) is x
                want = (expected_over(members, 13, dtype, op, salt=root) if rank == root
                        else inputs_of(rank, 13, dtype, op, salt=root))
                np.testing.assert_array_equal(x, want, err_msg=f"group reduce {root} {op}")
        mine = np.arange(5, dtype=np.int64) + 10 * rank
        got = dist.gather(mine, dst=root, group=group)
        if rank == root:
            assert len(got) == n
            for m, block in zip(members, got):
                np.testing.assert_array_equal(block, np.arange(5, dtype=np.int64) + 10 * m)
        else:
            assert got is None
        out = np.zeros(7, np.float64)
        parts = [np.full(7, 100.0 * root + m) for m in members] if rank == root else None
        dist.scatter(out, parts, src=root, group=group)
        np.testing.assert_array_equal(out, np.full(7, 100.0 * root + rank))
        items = [root, "g" * root] if rank == root else [None, None]
        assert dist.broadcast_object_list(items, src=root, group=group) is items
        assert items == [root, "g" * root]
    for dtype in (np.float32, np.int64):
        for op in ops_for(dtype):
            full = inputs_of(rank, n * 6, dtype, op, salt=1)
            reduced = expected_over(members, n * 6, dtype, op, salt=1)
            chunk = dist.reduce_scatter(full.copy(), op, group=group)
            np.testing.assert_array_equal(chunk, reduced[me * 6:(me + 1) * 6],
                                          err_msg=f"group reduce_scatter {dtype} {op}")
    dist.barrier(group=group)
    # point to point around the group's ring, by global rank
    nxt, prev = members[(me + 1) % n], members[(me - 1) % n]
    msg, got = np.full(9, rank, dtype=np.int32), np.empty(9, dtype=np.int32)
    if me % 2 == 0:
        dist.send(msg, nxt, group=group)
        dist.recv(got, prev, group=group)
    else:
        dist.recv(got, prev, group=group)
        dist.send(msg, nxt, group=group)
    np.testing.assert_array_equal(got, np.full(9, prev, dtype=np.int32))
    # a million elements: the ring all-reduce over the group's transport
    for dtype, op in ((np.float32, dist.ReduceOp.SUM), (np.float64, dist.ReduceOp.AVERAGE)):
        x = inputs_of(rank, LARGE, dtype, op, salt=2)
        dist.all_reduce(x, op, group=group)
        np.testing.assert_array_equal(x, expected_over(members, LARGE, dtype, op, salt=2),
                                      err_msg=f"group all_reduce {LARGE} {dtype} {op}")
    # a rank outside the group is not a valid src/dst
    outsider = next(r for r in range(4) if r not in members)
    try:
        dist.reduce(np.ones(2), dst=outsider, group=group)
    except ValueError as exc:
        assert f"dst={outsider} is not in group" in str(exc), exc
    else:
        raise AssertionError("reduce accepted a dst outside the group")


def subgroup_outsider_checks(rank: int, group) -> None:
    """A non-member: rank and size -1 (as in PyTorch), and every call on the group refused."""
    assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
    buf = np.ones(6)
    calls = {"reduce": lambda: dist.reduce(buf, dst=group.ranks[0], group=group),
             "gather": lambda: dist.gather(buf, dst=group.ranks[0], group=group),
             "scatter": lambda: dist.scatter(buf, None, src=group.ranks[0], group=group),
             "reduce_scatter": lambda: dist.reduce_scatter(buf, dist.ReduceOp.SUM, group=group),
             "barrier": lambda: dist.barrier(group=group),
             "send": lambda: dist.send(buf, group.ranks[0], group=group),
             "recv": lambda: dist.recv(buf, group.ranks[0], group=group),
             "broadcast_object_list": lambda: dist.broadcast_object_list(
                 [None], src=group.ranks[0], group=group),
             "all_reduce": lambda: dist.all_reduce(np.ones(LARGE), group=group)}
    for name, call in calls.items():
        try:
            call()
        except ValueError as exc:
            assert f"rank {rank} is not a member" in str(exc), (name, exc)
        else:
            raise AssertionError(f"a non-member ran {name} on the group")


# ----- tests -------------------------------------------------------------------------------
@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_every_algorithm_of_the_other_collectives(backend, world_size):
    assert run_ranks(forced_algorithms_suite, world_size, backend, timeout=200,
                     args=(FORCED_OTHERS[backend],), init_kwargs=INIT) == [True] * world_size


@pytest.mark.parametrize("world_size", [2, 3, 4])
def test_async_order_and_subgroups(backend, world_size):
    assert run_ranks(async_and_groups_suite, world_size, backend, timeout=120,
                     init_kwargs=INIT) == [True] * world_size
