"""Faults injected from outside into a running 3-rank all-reduce on shm and tcp: SIGKILL of the
first, a middle and the last rank, SIGSTOP (a hung rank, the store host included), a socket
closed under a collective. Every survivor raises PeerFailureError naming itself, the operation
and the failed peer, exits 1 on its own, and nothing (process, shared-memory segment) is left.

The same faults under mpiexec are in test_mpi_rank_faults.py; a rank's own program ending it
(clean exit, exception) in test_rank_faults.py. scripts/fault_injection_report.py measures the
detection times of these faults for docs/fault-tolerance.md.
"""
from __future__ import annotations

import pytest

from fault_injector import run_fault
from fault_outcomes import assert_failed_cleanly

pytestmark = pytest.mark.timeout(150)
WORLD_SIZE = 3
DETECT_LIMIT_S = 20.0
# A short heartbeat, so that a stopped rank is declared hung after about 2 s instead of 6 to 7.
HEARTBEAT_INTERVAL_S, HEARTBEAT_TIMEOUT_S = 0.2, 2.0
FAST_HEARTBEAT = {"NEURAL_ARCH_HEARTBEAT_INTERVAL": str(HEARTBEAT_INTERVAL_S),
                  "NEURAL_ARCH_HEARTBEAT_TIMEOUT": str(HEARTBEAT_TIMEOUT_S)}


@pytest.mark.parametrize("backend", ["tcp", "shm"])
@pytest.mark.parametrize("victim", [0, 1, 2], ids=["first", "middle", "last"])
def test_sigkill_mid_all_reduce_is_named_by_every_survivor(backend, victim, tmp_path):
    outcome = run_fault("kill", backend, WORLD_SIZE, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S)
    assert outcome.exit_codes[victim] == -9
    assert_failed_cleanly(outcome)


@pytest.mark.parametrize("backend, victim", [("tcp", 1), ("tcp", 0), ("shm", 1), ("shm", 0)],
                         ids=["tcp-middle", "tcp-store-host", "shm-middle", "shm-store-host"])
def test_stopped_rank_is_declared_hung_by_the_heartbeat(backend, victim, tmp_path):
    outcome = run_fault("stop", backend, WORLD_SIZE, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S, env=FAST_HEARTBEAT)
    # The survivors left while the victim was still stopped: only then was it killed.
    assert_failed_cleanly(outcome)
    for rank in outcome.survivors:
        assert "heartbeat: peer rank" in outcome.errors[rank]["message"]
        # Found by the heartbeat's silence limit (counted from the last beat, at most one
        # interval before the stop), not by the 120 s collective timeout.
        assert outcome.detection_s(rank) >= HEARTBEAT_TIMEOUT_S - HEARTBEAT_INTERVAL_S


def test_socket_closed_under_a_collective_fails_both_ends_and_the_bystander(tmp_path):
    victim = 1
    outcome = run_fault("close_socket", "tcp", WORLD_SIZE, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S)
    cut_peer = (victim + 1) % WORLD_SIZE
    # The rank that closed its socket names the peer it cut itself off from.
    own = outcome.errors.get(victim)
    assert own is not None and own["type"] == "PeerFailureError", outcome.logs
    assert own["peer"] == cut_peer and own["op"] == "all_reduce:sum", own
    assert outcome.exit_codes[victim] == 1
    assert_failed_cleanly(outcome, named={victim, cut_peer})
