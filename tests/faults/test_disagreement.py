"""Ranks that disagree on what they call fail at once, on every rank, naming who passed what.

Two disagreements are covered: the root of a rooted collective (``broadcast``, ``reduce``,
``gather``, ``scatter``, ``broadcast_object_list``) on every backend, and the backend itself
(one rank asks for shm, another for tcp). Each rank catches what its call raised and returns
it, so a rank that returned normally, one that raised something else, and one that hangs until
the short collective timeout all fail the test.
"""
from __future__ import annotations

import pytest

from dist_harness import installed_backends, run_ranks

BACKENDS = installed_backends()
ROOTED = ("broadcast", "reduce", "gather", "scatter", "broadcast_object_list")
# world size -> the root each rank passes: every rank its own, and one rank against the others
DISAGREEING = {2: (0, 1), 3: (0, 0, 2)}
INIT = {"timeout": 15}  # a hang before the fix ends as a timeout, not as a stuck test
RUN_TIMEOUT = 90


def _call(name: str, root: int, rank: int, world_size: int):
    """Run the rooted collective ``name`` with ``root`` as src/dst (``"all"``: each of them, in
    a dict by name); returns its result."""
    import numpy as np
    from neural_arch import distributed as dist
    if name == "all":
        return {each: _call(each, root, rank, world_size) for each in ROOTED}
    x = np.full(4, rank + 1, dtype=np.float32)
    if name == "broadcast":
        return dist.broadcast(x, src=root).tolist()
    if name == "reduce":
        return dist.reduce(x, dst=root).tolist()
    if name == "gather":
        out = dist.gather(x, dst=root)
        return None if out is None else [a.tolist() for a in out]
    if name == "scatter":
        parts = ([np.full(4, 10 * r + root, dtype=np.float32) for r in range(world_size)]
                 if rank == root else None)
        return dist.scatter(x, parts, src=root).tolist()
    objects = [f"from rank {rank}", rank] if rank == root else [None, None]
    return dist.broadcast_object_list(objects, src=root)


def _outcome(fn, *args) -> tuple:
    try:
        return ("returned", fn(*args))
    except Exception as exc:  # the test inspects what every rank raised
        return ("raised", type(exc).__name__, str(exc))


def _rooted_with(rank: int, world_size: int, name: str, roots: tuple) -> tuple:
    """The collective with this rank's root, then an all-reduce: the group must still work."""
    import numpy as np
    from neural_arch import distributed as dist
    first = _outcome(_call, name, roots[rank], rank, world_size)
    after = _outcome(lambda: dist.all_reduce(np.ones(3, dtype=np.float64)).tolist())
    return first, after


def _who(values: tuple, value) -> str:
    """"rank 2" or "ranks 0, 1": the ranks whose entry in ``values`` is ``value``."""
    ranks = [r for r, v in enumerate(values) if v == value]
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {', '.join(map(str, ranks))}"


def _assert_every_rank_names_the_roots(outcomes, roots: tuple, backend: str) -> None:
    for rank, outcome in enumerate(outcomes):
        assert outcome[0] == "raised", f"rank {rank} returned {outcome[1]!r} on {backend}"
        _, kind, message = outcome
        assert kind == "CollectiveMismatchError", f"rank {rank} raised {kind}: {message}"
        for root in set(roots):
            assert f"{_who(roots, root)} passed root {root}" in message, (rank, message)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", sorted(DISAGREEING))
@pytest.mark.parametrize("name", ROOTED)
@pytest.mark.parametrize("backend", BACKENDS)
def test_disagreeing_roots_fail_every_rank(backend, name, world_size):
    roots = DISAGREEING[world_size]
    results = run_ranks(_rooted_with, world_size, backend, timeout=RUN_TIMEOUT,
                        args=(name, roots), init_kwargs=INIT)
    _assert_every_rank_names_the_roots([first for first, _ in results], roots, backend)
    # Nothing of the refused call is left in flight: the next collective works on every rank.
    assert [after for _, after in results] == [("returned", [float(world_size)] * 3)] * world_size


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("backend", BACKENDS)
def test_agreeing_roots_still_work(backend, world_size):
    root = world_size - 1
    results = run_ranks(_rooted_with, world_size, backend, timeout=RUN_TIMEOUT,
                        args=("all", (root,) * world_size), init_kwargs=INIT)
    for rank, (first, after) in enumerate(results):
        assert first[0] == "returned", first
        got = first[1]
        assert got["broadcast"] == [float(root + 1)] * 4
        expected_sum = float(world_size * (world_size + 1) // 2)
        assert got["reduce"] == ([expected_sum] * 4 if rank == root else [float(rank + 1)] * 4)
        assert got["gather"] == ([[float(r + 1)] * 4 for r in range(world_size)]
                                 if rank == root else None)
        assert got["scatter"] == [float(10 * rank + root)] * 4
        assert got["broadcast_object_list"] == [f"from rank {root}", root]
        assert after == ("returned", [float(world_size)] * 3)


def _native_broadcast(rank: int, world_size: int, roots: tuple) -> tuple:
    import numpy as np
    from neural_arch import distributed as dist
    x = np.full(4, rank + 1, dtype=np.float32)
    return _outcome(lambda: dist.broadcast(x, src=roots[rank], algorithm="native").tolist())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("world_size", sorted(DISAGREEING))
def test_disagreeing_roots_of_mpis_own_broadcast_fail_every_rank(world_size):
    if "mpi" not in BACKENDS:
        pytest.skip("needs mpi4py and mpiexec")
    roots = DISAGREEING[world_size]
    outcomes = run_ranks(_native_broadcast, world_size, "mpi", timeout=RUN_TIMEOUT,
                         args=(roots,), init_kwargs=INIT)
    _assert_every_rank_names_the_roots(outcomes, roots, "mpi (native)")


def _rooted_in_subgroup(rank: int, world_size: int, name: str) -> tuple:
    """Ranks 1 and 2 form a group and each passes itself as the root (job-wide ranks)."""
    from neural_arch import distributed as dist
    group = dist.new_group([1, 2])
    if rank == 0:
        return ("outside",)
    return _outcome(lambda: _call_in(group, name, rank))


def _call_in(group, name: str, rank: int):
    import numpy as np
    from neural_arch import distributed as dist
    x = np.full(2, rank, dtype=np.float64)
    if name == "broadcast":
        return dist.broadcast(x, src=rank, group=group)
    if name == "reduce":
        return dist.reduce(x, dst=rank, group=group)
    return dist.gather(x, dst=rank, group=group)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("name", ["broadcast", "reduce", "gather"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_disagreeing_roots_in_a_subgroup_are_named_as_passed(backend, name):
    outcomes = run_ranks(_rooted_in_subgroup, 3, backend, timeout=RUN_TIMEOUT, args=(name,),
                         init_kwargs=INIT)
    assert outcomes[0] == ("outside",)
    for rank, outcome in enumerate(outcomes[1:], start=1):
        assert outcome[:2] == ("raised", "CollectiveMismatchError"), (rank, outcome)
        assert f"[rank {rank}," in outcome[2]
        assert "rank 1 passed root 1; rank 2 passed root 2" in outcome[2], outcome[2]


# ----- mixed backends ------------------------------------------------------------------------
def _init_with(rank: int, world_size: int, backends: tuple) -> tuple:
    from neural_arch import distributed as dist
    return _outcome(lambda: dist.init_process_group(backend=backends[rank], **INIT))


MIXED = [("shm", "tcp"), ("tcp", "shm"), ("shm", "tcp", "tcp"), ("tcp", "shm", "tcp"),
         ("tcp", "tcp", "shm")]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("backends", MIXED, ids="-".join)
def test_mixed_backends_fail_every_rank_at_rendezvous(backends):
    if not {"shm", "tcp"} <= set(BACKENDS):
        pytest.skip("needs both the shm and the tcp backend")
    outcomes = run_ranks(_init_with, len(backends), "none", timeout=RUN_TIMEOUT,
                         args=(backends,))
    for rank, outcome in enumerate(outcomes):
        assert outcome[0] == "raised", f"rank {rank} joined the job with {backends[rank]}"
        _, kind, message = outcome
        assert kind == "CollectiveMismatchError", f"rank {rank} raised {kind}: {message}"
        for name in ("shm", "tcp"):
            assert f"{_who(backends, name)} chose {name!r}" in message, (rank, message)
