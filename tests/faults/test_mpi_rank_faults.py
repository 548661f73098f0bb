"""Rank faults in a 3-rank job started by plain mpiexec (backend mpi, one host): SIGKILL of the
first, a middle and the last rank, SIGSTOP, an early clean exit and an exception.

Open MPI ends the whole job when a rank dies, so a killed rank ends in mpiexec exiting non-zero
at once, every other rank killed, nothing left. A stopped rank is found by the heartbeat's pid
watch, a rank that left by the notice its transport sends as it closes; the survivors then end
the job (they exit without MPI_Finalize) rather than wait for that rank there. SIGKILL with ``--enable-recovery`` is covered in
tests/distributed/group/test_process_group_multiprocess.py, ranks out of each other's pid sight
in tests/distributed/health/test_mpi_heartbeat.py.
"""
from __future__ import annotations

import pytest

from dist_harness import mpi_available
from fault_injector import run_mpi_fault
from fault_outcomes import assert_failed_cleanly

pytestmark = [pytest.mark.timeout(150),
              pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")]
WORLD_SIZE = 3
FAST_HEARTBEAT = {"NEURAL_ARCH_HEARTBEAT_INTERVAL": "0.2", "NEURAL_ARCH_HEARTBEAT_TIMEOUT": "2.0"}
# Long enough that a survivor meant to learn of the fault does so well before it; short enough
# that a survivor left waiting fails the test soon.
COLLECTIVE_TIMEOUT_S = 6.0
EXIT_LIMIT_S = 6.0  # how long the survivors get to end on their own once they have reported


@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
def test_a_killed_rank_ends_the_whole_job_non_zero(victim, tmp_path):
    outcome = run_mpi_fault("kill", WORLD_SIZE, victim, tmp_path)
    assert outcome.launcher_exit not in (0, None), outcome.logs
    assert outcome.stuck == []
    # mpiexec usually kills the survivors first; one that was quicker names the dead rank.
    for rank, error in outcome.errors.items():
        assert error["type"] == "PeerFailureError" and error["peer"] == victim, (rank, error)
    assert outcome.finished == [], outcome.logs
    assert outcome.leftover_pids == [] and outcome.leftover_segments == [], outcome


@pytest.fixture(scope="module")
def stopped(tmp_path_factory):
    """Rank 0 stopped mid-all-reduce; the survivors get EXIT_LIMIT_S to end on their own."""
    return run_mpi_fault("stop", WORLD_SIZE, 0, tmp_path_factory.mktemp("stopped"),
                         exit_limit=EXIT_LIMIT_S, env=FAST_HEARTBEAT)


@pytest.mark.slow
def test_a_stopped_rank_is_named_by_every_survivor(stopped):
    for rank in stopped.survivors:
        error = stopped.errors.get(rank)
        assert error is not None, stopped.logs
        assert error["type"] == "PeerFailureError" and error["peer"] == 0, error
        assert f"[rank {rank}, all_reduce:sum #" in error["message"], error
        assert "has been stopped for" in error["message"], error  # the pid watch
    assert stopped.finished == []
    assert stopped.leftover_pids == [] and stopped.leftover_segments == [], stopped


@pytest.mark.slow
def test_the_survivors_of_a_stopped_rank_end_on_their_own(stopped):
    # A survivor of a broken MPI job exits without finalizing: mpiexec then stops every rank,
    # the stopped one included, and exits non-zero.
    assert stopped.stuck == []
    assert stopped.launcher_exit not in (0, None), stopped.logs


@pytest.fixture(scope="module", params=["exit", "raise"])
def left_mid_job(request, tmp_path_factory):
    """The middle rank's program ends between two collectives (exit code 0 without
    destroy_process_group, or an uncaught exception) while the others wait in the next one."""
    return run_mpi_fault(request.param, WORLD_SIZE, 1, tmp_path_factory.mktemp(request.param),
                         timeout=COLLECTIVE_TIMEOUT_S, exit_limit=EXIT_LIMIT_S,
                         env=FAST_HEARTBEAT)


@pytest.mark.slow
def test_a_rank_that_leaves_mid_job_ends_the_job_non_zero(left_mid_job):
    outcome = left_mid_job
    assert outcome.launcher_exit not in (0, None), outcome.logs
    assert outcome.stuck == []
    for rank in outcome.survivors:  # a named error of this rank, whatever found it
        error = outcome.errors.get(rank)
        assert error is not None, outcome.logs
        assert error["type"] in ("PeerFailureError", "CollectiveTimeoutError"), error
        assert error["message"].startswith(f"[rank {rank}, all_reduce:sum #"), error
    assert 1 not in outcome.errors, outcome.errors[1]  # it left between collectives
    assert outcome.finished == []
    assert outcome.leftover_pids == [] and outcome.leftover_segments == [], outcome


@pytest.mark.slow
def test_a_rank_that_leaves_mid_job_is_named_by_every_survivor(left_mid_job):
    # The leaving rank's transport tells its peers as it closes; the survivor waiting for it
    # names it and tells the others.
    assert_failed_cleanly(left_mid_job)
