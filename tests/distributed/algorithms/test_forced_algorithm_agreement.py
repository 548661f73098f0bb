"""A call's ``algorithm=`` is part of its fingerprint: ranks that force different algorithms
(or one rank forces one and the others leave the choice to the library) raise
CollectiveMismatchError, on every transport, instead of exchanging messages that look alike
and returning different results (two tcp ranks, one forcing the ring on a 1-element
all-reduce, once ended with 3 on one rank and 5 on the other). On shared memory a forced
ring meets the others in shared memory's barrier first, so a rank running the direct
collective meets it there and both raise at once, not at the group's timeout; on the mpi
transport a forced ``native`` (MPI's own collective) meets them in the dissemination
barrier's messages, where our algorithms' messages run into it. What
``NEURAL_ARCH_ALLREDUCE_ALGO`` forces counts for an all-reduce without ``algorithm=``: under
it, ``algorithm="auto"`` on one rank and nothing on another disagree, and ``"ring"`` on one
and nothing on another agree. Ranks that force the same algorithm (under any of its names)
get NumPy's result.
"""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks

pytestmark = pytest.mark.timeout(120)
GROUP_TIMEOUT_S = 20.0  # far beyond a prompt mismatch; what a rank left waiting would take
RING = {"NEURAL_ARCH_ALLREDUCE_ALGO": "ring"}  # read at init_process_group, on every rank


def _call(collective: str, n: int, rank: int, world_size: int, algorithm):
    from neural_arch import distributed as dist
    x = np.arange(n, dtype=np.float32) + rank + 1
    if collective == "all_reduce":
        dist.all_reduce(x, algorithm=algorithm)
        return x
    if collective == "broadcast":
        dist.broadcast(x, 0, algorithm=algorithm)
        return x
    if collective == "all_gather":
        out = np.empty(n * world_size, np.float32)
        dist.all_gather_into_tensor(out, x, algorithm=algorithm)
        return out
    if collective == "reduce_scatter":
        out = np.empty(n, np.float32)
        dist.reduce_scatter_tensor(out, np.tile(x, world_size), algorithm=algorithm)
        return out
    dist.barrier(algorithm=algorithm)
    return np.zeros(0, np.float32)


def _reference(collective: str, n: int, rank: int, world_size: int) -> np.ndarray:
    inputs = [np.arange(n, dtype=np.float32) + r + 1 for r in range(world_size)]
    if collective == "all_reduce":
        return np.sum(inputs, axis=0, dtype=np.float32)
    if collective == "broadcast":
        return inputs[0]
    if collective == "all_gather":
        return np.concatenate(inputs)
    if collective == "reduce_scatter":
        return np.sum(inputs, axis=0, dtype=np.float32)
    return np.zeros(0, np.float32)


def forcing_worker(rank: int, world_size: int, collective: str, n: int, choices: tuple):
    from neural_arch import distributed as dist
    dist.all_reduce(np.ones(4))  # an agreed call first: the fingerprints' sequence is in step
    try:
        return "returned", _call(collective, n, rank, world_size, choices[rank])
    except dist.DistributedError as exc:
        return type(exc).__name__, str(exc)


DISAGREE = [  # (backend, world size, collective, elements, each rank's algorithm=, env)
    ("shm", 2, "all_reduce", 1, ("ring", None), {}),
    ("shm", 3, "broadcast", 5, (None, "tree", None), {}),
    ("shm", 2, "reduce_scatter", 1000, ("shm_direct", "ring"), {}),
    ("shm", 2, "all_reduce", 1, ("auto", None), RING),
    ("tcp", 2, "all_reduce", 1, ("ring", None), {}),
    ("tcp", 2, "all_reduce", 1, ("auto", None), RING),
    ("tcp", 3, "all_gather", 3, ("ring", "recursive_doubling", "ring"), {}),
    ("tcp", 3, "reduce_scatter", 7, ("recursive_doubling", "ring", "ring"), {}),
    ("tcp", 2, "barrier", 0, ("dissemination", None), {}),
] + [  # a forced MPI collective first meets the others in the dissemination barrier
    ("mpi", 2, "all_reduce", 1, ("ring", None), {}),
    ("mpi", 2, "all_reduce", 1, ("native", None), {}),
    ("mpi", 2, "barrier", 0, (None, "native"), {}),
    ("mpi", 2, "all_gather", 3, ("native", "ring"), {}),
    ("mpi", 3, "broadcast", 5, (None, "native", "native"), {}),
] * ("mpi" in installed_backends())


@pytest.mark.parametrize("backend, world_size, collective, n, choices, env", DISAGREE)
def test_ranks_forcing_different_algorithms_raise(backend, world_size, collective, n, choices,
                                                  env):
    results = run_ranks(forcing_worker, world_size, backend, timeout=60,
                        args=(collective, n, choices), env=env,
                        init_kwargs={"timeout": GROUP_TIMEOUT_S})
    kinds = [kind for kind, _ in results]
    assert "returned" not in kinds, results  # no rank may go on with a result
    mismatches = [text for kind, text in results if kind == "CollectiveMismatchError"]
    assert mismatches, results
    assert any("@" in text for text in mismatches), mismatches  # the forced name is shown
    for kind, text in results:  # every rank hears of it from a peer, not from its timeout
        assert "did not" not in text and "timed out" not in text.lower(), results
    if backend == "shm":  # the barrier in front of the forced ring tells every rank
        assert kinds == ["CollectiveMismatchError"] * world_size, results


AGREE = [
    ("shm", 2, "all_reduce", 1000, ("ring", "ring"), {}),
    ("shm", 2, "all_reduce", 7, ("ring", None), RING),
    ("shm", 3, "all_gather", 5, ("rd", "recursive_doubling", "recursive-doubling"), {}),
    ("tcp", 3, "all_reduce", 1, ("rd", "recursive_doubling", "rd"), {}),
    ("tcp", 2, "all_reduce", 1, ("ring", None), RING),
    ("tcp", 2, "broadcast", 9, ("tree", "tree"), {}),
] + [
    ("mpi", 2, "all_reduce", 3, ("native", "mpi"), {}),
    ("mpi", 3, "broadcast", 4, ("native", "native", "native"), {}),
] * ("mpi" in installed_backends())


@pytest.mark.parametrize("backend, world_size, collective, n, choices, env", AGREE)
def test_ranks_forcing_the_same_algorithm_get_numpys_result(backend, world_size, collective, n,
                                                            choices, env):
    results = run_ranks(forcing_worker, world_size, backend, timeout=60,
                        args=(collective, n, choices), env=env,
                        init_kwargs={"timeout": GROUP_TIMEOUT_S})
    for rank, (kind, got) in enumerate(results):
        assert kind == "returned", results
        np.testing.assert_array_equal(got, _reference(collective, n, rank, world_size))
