"""A job is one failure domain.

A rank that dies or hangs fails the collectives of every other rank, those of a subgroup it is
not in included: no survivor runs on, none exits 0, and every one names that rank.
"""
from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import DistributedError

from dist_harness import RankFailed, mpi_available, run_ranks
from fault_injection_job import FaultOutcome, run_fault

pytestmark = pytest.mark.timeout(150)
DETECT_LIMIT_S = 20.0  # how long the survivors are given; detection takes 0.1 s to 7 s


def assert_every_survivor_named(outcome: FaultOutcome) -> None:
    """Every survivor raised PeerFailureError naming the victim in its all-reduce and exited 1;
    no process and no shared-memory segment is left."""
    for rank in outcome.survivors:
        error = outcome.errors.get(rank)
        assert error is not None, (f"rank {rank} reported no error (exit code "
                                   f"{outcome.exit_codes[rank]}):\n{outcome.logs}")
        assert error["type"] == "PeerFailureError", error
        assert error["peer"] == outcome.victim, error
        assert error["op"] == "all_reduce:sum", error
        assert error["message"].startswith(
            f"[rank {rank}, all_reduce:sum #{error['seq']}, peer rank {outcome.victim}]"), error
        assert outcome.exit_codes[rank] == 1, outcome.exit_codes
    assert outcome.leftover_pids == [], outcome.leftover_pids
    assert outcome.leftover_segments == [], outcome.leftover_segments


# ----- a rank outside the subgroup that loops -----------------------------------------------------
OUTSIDE = [(3, [0, 1], 2), (4, [0, 1, 2], 3), (3, [1, 2], 0)]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("world_size, group, victim", OUTSIDE,
                         ids=["3-ranks-last-dies", "4-ranks-last-dies", "3-ranks-store-host-dies"])
def test_a_rank_outside_the_subgroup_that_dies_fails_every_survivor(backend, world_size, group,
                                                                     victim, tmp_path):
    outcome = run_fault("kill", backend, world_size, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S, group=group)
    assert outcome.exit_codes[victim] == -9
    assert_every_survivor_named(outcome)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_rank_outside_the_subgroup_that_hangs_fails_every_survivor(backend, tmp_path):
    outcome = run_fault("stop", backend, 3, 2, tmp_path, detect_limit=DETECT_LIMIT_S,
                        group=[0, 1])
    assert_every_survivor_named(outcome)
    for rank in outcome.survivors:
        assert "heartbeat: peer rank 2 failed" in outcome.errors[rank]["message"]


def _loop_in_subgroup_under_mpi(rank, world_size, fault, out_dir):
    """Ranks 0 and 1 all-reduce on their subgroup; rank 2, outside it, is killed or stopped."""
    from neural_arch import distributed as dist
    group = dist.new_group([0, 1])
    pids = dist.all_gather_object(os.getpid())
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL if fault == "kill" else signal.SIGSTOP)
        return None
    record, x = {"type": None, "peer": None, "message": "ran on"}, np.ones(4)
    run_on_until = time.monotonic() + DETECT_LIMIT_S
    try:
        while time.monotonic() < run_on_until:
            dist.all_reduce(x, group=group)
    except DistributedError as e:
        record = {"type": type(e).__name__, "peer": e.peer, "message": str(e)}
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    if fault == "stop" and rank == 0:  # both survivors have reported: end the stopped rank
        deadline = time.monotonic() + DETECT_LIMIT_S
        while time.monotonic() < deadline and not os.path.exists(
                os.path.join(out_dir, "rank1.json")):
            time.sleep(0.05)
        os.kill(pids[2], signal.SIGKILL)
    return record


@pytest.mark.skipif(not mpi_available(), reason="mpi4py or mpiexec is not installed")
@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_mpi_a_rank_outside_the_subgroup_fails_every_survivor(fault, tmp_path):
    # Under plain mpiexec a killed rank aborts the whole job (nothing to detect); with
    # --enable-recovery (what may_die asks for) the survivors go on and must find it.
    try:
        run_ranks(_loop_in_subgroup_under_mpi, 3, "mpi", args=(fault, str(tmp_path)),
                  may_die=[2] if fault == "kill" else (), timeout=90,
                  init_kwargs={"timeout": 60})
    except RankFailed:
        pass  # killing the stopped rank under plain mpiexec ends the job: the files remain
    for rank in (0, 1):
        record = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert record["type"] == "PeerFailureError" and record["peer"] == 2, record
        assert record["message"].startswith(f"[rank {rank}, all_reduce:sum #"), record
