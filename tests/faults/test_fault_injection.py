"""Faults injected into a running 3-rank all-reduce: every survivor fails within 10 s, naming
itself, the operation and the failed peer, and nothing (process, shared-memory segment) is left.

Checkpoint damage and SIGTERM are covered in test_checkpoint_corruption.py, test_preemption.py
and test_resume.py; scripts/fault_injection_report.py measures all of them together.
"""
from __future__ import annotations

import pytest

from fault_injection_job import FaultOutcome, run_fault

pytestmark = pytest.mark.timeout(150)
WORLD_SIZE = 3
DETECT_LIMIT_S = 10.0


def assert_failed_cleanly(outcome: FaultOutcome, named=None) -> None:
    """Every survivor raised PeerFailureError in time, naming itself, the op and a failed peer."""
    named = {outcome.victim} if named is None else named
    for rank in outcome.survivors:
        error = outcome.errors.get(rank)
        assert error is not None, f"rank {rank} reported no error:\n{outcome.logs}"
        assert error["type"] == "PeerFailureError", error
        assert error["op"] == "all_reduce:sum" and error["peer"] in named, error
        assert error["message"].startswith(
            f"[rank {rank}, all_reduce:sum #{error['seq']}, peer rank {error['peer']}]"), error
        detection = outcome.detection_s(rank)
        assert 0 <= detection < DETECT_LIMIT_S, (rank, detection, error)
        assert outcome.exit_codes[rank] == 1, outcome.exit_codes
    assert outcome.leftover_pids == [], outcome.leftover_pids
    assert outcome.leftover_segments == [], outcome.leftover_segments


@pytest.mark.parametrize("backend", ["tcp", "shm"])
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
def test_sigkill_mid_all_reduce_is_named_by_every_survivor(backend, victim, tmp_path):
    outcome = run_fault("kill", backend, WORLD_SIZE, victim, tmp_path)
    assert outcome.exit_codes[victim] == -9
    assert_failed_cleanly(outcome)


@pytest.mark.parametrize("backend, victim", [("tcp", 1), ("tcp", 0), ("shm", 1)],
                         ids=["tcp-middle", "tcp-store-host", "shm-middle"])
def test_stopped_rank_is_declared_hung_by_the_heartbeat(backend, victim, tmp_path):
    outcome = run_fault("stop", backend, WORLD_SIZE, victim, tmp_path)
    assert_failed_cleanly(outcome)
    for rank in outcome.survivors:
        assert "heartbeat: peer rank" in outcome.errors[rank]["message"]
        # Found by the heartbeat's timeout (6 s by default), not by the 120 s collective one.
        assert outcome.detection_s(rank) > 3.0


def test_socket_closed_under_a_collective_fails_both_ends_and_the_bystander(tmp_path):
    victim = 1
    outcome = run_fault("close_socket", "tcp", WORLD_SIZE, victim, tmp_path)
    cut_peer = (victim + 1) % WORLD_SIZE
    # The rank that closed its socket names the peer it cut itself off from.
    own = outcome.errors.get(victim)
    assert own is not None and own["type"] == "PeerFailureError", outcome.logs
    assert own["peer"] == cut_peer and own["op"] == "all_reduce:sum", own
    assert_failed_cleanly(outcome, named={victim, cut_peer})
