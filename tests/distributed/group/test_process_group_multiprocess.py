"""Process-group life cycle and failure handling on real processes, for every backend."""
from __future__ import annotations

import os
import re
import signal
import socket
import time

import numpy as np
import pytest

from dist_harness import free_port, run_ranks
from neural_arch import distributed as dist

pytestmark = pytest.mark.timeout(180)

SHORT = {"timeout": 10}


def describe(exc: BaseException) -> tuple[str, str]:
    return type(exc).__name__, str(exc)


def queries(rank: int, ws: int) -> dict:
    info = dist.get_distributed_info()
    return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
            "local_rank": dist.get_local_rank(), "backend": dist.get_backend(),
            "initialized": dist.is_initialized(), "info": info}


@pytest.mark.parametrize("world_size", [1, 2, 4])
def test_rank_queries_and_info(backend, world_size):
    results = run_ranks(queries, world_size, backend, timeout=60, init_kwargs=SHORT)
    # one host: local ranks are a permutation of the ranks (mpiexec need not keep their order)
    assert sorted(r["local_rank"] for r in results) == list(range(world_size))
    for rank, got in enumerate(results):
        assert (got["rank"], got["world_size"]) == (rank, world_size)
        if backend != "mpi":  # the harness sets LOCAL_RANK = RANK
            assert got["local_rank"] == rank
        assert got["backend"] == backend and got["initialized"]
        info = got["info"]
        assert (info["rank"], info["world_size"], info["backend"]) == (rank, world_size, backend)
        assert info["initialized"] and backend in info["available_transports"]
        assert info["host"] == socket.gethostname()
        assert (info["local_rank"], info["local_world_size"]) == (got["local_rank"], world_size)


@pytest.mark.parametrize("requested", ["auto", "gloo"])
def test_auto_backend_uses_shared_memory_on_one_host(requested):
    results = run_ranks(queries, 3, requested, timeout=60, init_kwargs=SHORT)
    assert [r["backend"] for r in results] == ["shm"] * 3


def reinit(rank: int, ws: int) -> list:
    # a fresh port for the second rendezvous: rank 0's old store may still be closing
    port = dist.all_gather_object(free_port() if rank == 0 else None)[0]
    backend = dist.get_backend()
    dist.destroy_process_group()
    assert not dist.is_initialized()
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", world_size=ws,
                            rank=rank, timeout=10)
    x = np.full(4, rank + 1.0)
    dist.all_reduce(x)
    return [x.tolist(), dist.get_distributed_info()["master_port"] == port]


def test_destroy_then_init_again_with_a_tcp_init_method(backend):
    for got in run_ranks(reinit, 2, backend, timeout=60, init_kwargs=SHORT):
        assert got == [[3.0] * 4, True]


def mismatched_ops(rank: int, ws: int, kind: str):
    x = np.zeros(8)
    try:
        if kind == "ops":
            dist.all_reduce(x) if rank == 0 else dist.broadcast(x, src=0)
        elif kind == "sizes":
            dist.all_reduce(np.zeros(8 + rank))
        elif kind == "dtypes":
            dist.all_reduce(np.zeros(8, dtype=np.float64 if rank == 0 else np.float32))
        elif kind == "skipped":
            # rank 1 skips the barrier: collective #2 is a barrier on rank 0, an all-reduce on 1
            dist.all_reduce(x)
            if rank == 0:
                dist.barrier()
            dist.all_reduce(x)
        else:  # "skipped_empty": rank 1 skips an all-reduce of no elements
            if rank == 0:
                dist.all_reduce(np.zeros(0))
            dist.all_reduce(x)
    except dist.DistributedError as exc:
        return describe(exc)
    return None


# What each rank's collective is, as the error messages describe it (Fingerprint.describe).
AR8 = "all_reduce:sum #{} (group 0, 8 x float64)"
MISMATCH_SIDES = {
    "ops": [("all_reduce", "broadcast")],
    "sizes": [("8 x float64", "9 x float64")],
    "dtypes": [(AR8.format(1), "all_reduce:sum #1 (group 0, 8 x float32)")],
    "skipped": [("barrier #2 (group 0, 0 x uint8)", AR8.format(2))],
    # a transport that sends nothing for an empty collective sees the sequence numbers differ;
    # one that synchronises even then sees the element counts differ
    "skipped_empty": [(AR8.format(2), AR8.format(1)),
                      ("all_reduce:sum #1 (group 0, 0 x float64)", AR8.format(1))],
}


@pytest.mark.parametrize("kind", list(MISMATCH_SIDES))
def test_mismatched_collectives_raise_naming_both_sides(backend, kind):
    # a rank that did not see the mismatch itself waits for its peer: keep that wait short
    results = run_ranks(mismatched_ops, 2, backend, timeout=60, args=(kind,),
                        init_kwargs={"timeout": 5})
    assert all(r is not None for r in results), results  # every rank raised
    mismatches = [msg for name, msg in results if name == "CollectiveMismatchError"]
    assert mismatches, results
    assert any(mine in m and theirs in m for m in mismatches
               for mine, theirs in MISMATCH_SIDES[kind]), mismatches
    for msg in mismatches:  # "[rank R, op #seq, peer rank P] ...": the peer is the other rank
        head = re.match(r"\[rank (\d), \S+ #\d+, peer rank (\d)\] ", msg)
        assert head and {head[1], head[2]} == {"0", "1"}, msg


def killed_peer(rank: int, ws: int):
    try:
        # The last rank may leave this barrier and die while a survivor is still inside it
        # (over tcp, waiting on another peer): then the survivor rightly raises here.
        dist.barrier()
        if rank == ws - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        for _ in range(3):
            dist.all_reduce(np.ones(1000))
    except dist.DistributedError as exc:
        return describe(exc)
    return None


@pytest.mark.parametrize("world_size", [2, 3])
def test_killed_peer_makes_survivors_raise_naming_it(backend, world_size):
    results = run_ranks(killed_peer, world_size, backend, timeout=60, init_kwargs=SHORT,
                        may_die=[world_size - 1])
    survivors = results[:-1]
    # PeerFailureError, not CollectiveTimeoutError: the death was noticed before the 10 s timeout
    assert [r[0] for r in survivors] == ["PeerFailureError"] * (world_size - 1), survivors
    assert any(f"peer rank {world_size - 1}" in msg for _, msg in survivors), survivors


def late_peer(rank: int, ws: int, done: str):
    if rank == 1:
        # silent until rank 0 is done waiting (it touches ``done``; it would time out after
        # 3 s): never part of its all-reduce, and no longer asleep than that needs
        deadline = time.monotonic() + 30
        while not os.path.exists(done) and time.monotonic() < deadline:
            time.sleep(0.05)
        return None
    try:
        dist.all_reduce(np.ones(10))
    except dist.DistributedError as exc:
        return describe(exc)
    finally:
        open(done, "w").close()
    return None


def test_a_silent_peer_times_out(backend, tmp_path):
    results = run_ranks(late_peer, 2, backend, timeout=60, args=(str(tmp_path / "done"),),
                        init_kwargs={"timeout": 3})
    name, message = results[0]
    assert name == "CollectiveTimeoutError", results[0]
    assert "all_reduce" in message and "rank 0" in message
    # the first collective after init: sequence number 1, waiting on peer rank 1
    assert re.match(r"\[rank 0, all_reduce\S* #1, peer rank 1\] ", message), message


def mismatched_groups(rank: int, ws: int):
    try:
        dist.new_group([0, 1] if rank == 0 else [0, 2])
    except ValueError as exc:
        return describe(exc)
    return None


def test_new_group_must_get_the_same_ranks_everywhere(backend):
    for name, message in run_ranks(mismatched_groups, 3, backend, timeout=60,
                                   init_kwargs=SHORT):
        assert name == "ValueError" and "different arguments" in message



def forced_algorithms(rank: int, ws: int, settings: list):
    """Init again under each of ``settings`` (every rank's NEURAL_ARCH_ALLREDUCE_ALGO for one
    attempt, None: unset): the error of an attempt that failed, or an all-reduce's result."""
    from neural_arch.distributed import algorithms
    backend, outcomes = dist.get_backend(), []
    for values in settings:
        # a fresh port for every rendezvous (as in ``reinit``), from the group still up
        port = dist.all_gather_object(free_port() if rank == 0 else None)[0]
        dist.destroy_process_group()
        if values[rank] is None:
            os.environ.pop(algorithms.ENV_ALLREDUCE_ALGO, None)
        else:
            os.environ[algorithms.ENV_ALLREDUCE_ALGO] = values[rank]
        try:
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}",
                                    world_size=ws, rank=rank, timeout=10)
        except ValueError as exc:
            outcomes.append(describe(exc))
            os.environ.pop(algorithms.ENV_ALLREDUCE_ALGO, None)  # the next attempt's group
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port + 1}",
                                    world_size=ws, rank=rank, timeout=10)
            continue
        x = np.full(5, rank + 1.0)
        dist.all_reduce(x)
        outcomes.append(x.tolist())
    return outcomes


def test_ranks_must_read_the_forced_all_reduce_algorithm_alike(backend):
    """Ranks that force different all-reduce algorithms through the environment (one unset,
    one another name) fail at init naming every rank's reading; aliases of one algorithm, and
    unset against 'auto', agree and train on."""
    long = "x" * 50
    settings = [(None, "rd"), ("recursive-doubling", "rd"), ("ring", "RING ALGO"),
                ("auto", None), ("", "auto"), (" ", None), (long + "a", long + "b")]
    for rank, outcomes in enumerate(run_ranks(forced_algorithms, 2, backend, timeout=90,
                                             args=(settings,), init_kwargs=SHORT)):
        unset, aliases, unknown, auto, empty, blank, cut = outcomes
        assert unset[0] == "ValueError", unset
        assert ("NEURAL_ARCH_ALLREDUCE_ALGO must mean the same on every rank: rank 0 read it "
                "as 'auto'; rank 1 read it as 'recursive_doubling'") in unset[1], unset
        assert aliases == auto == empty == [3.0] * 5
        assert unknown[0] == "ValueError" and "'RING ALGO'" in unknown[1], unknown
        # a blank value names no algorithm (every all-reduce would raise), unlike unset
        assert blank[0] == "ValueError" and "rank 0 read it as ' '" in blank[1], blank
        # two long values alike in the bytes shown are told apart by their CRC
        assert cut[0] == "ValueError" and cut[1].count("x" * 40 + "... (CRC ") == 2, cut
