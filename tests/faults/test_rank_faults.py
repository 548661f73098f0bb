"""A rank's own program ends it in the middle of a 3-rank job on shm and tcp: the script ends
with exit code 0 without calling destroy_process_group (an early clean exit), or an exception
escapes it. It leaves between two collectives while the others already wait in the next one;
every survivor must raise PeerFailureError naming it, exit 1 on its own, and leave nothing.

Faults injected from outside (SIGKILL, SIGSTOP, a closed socket) are in test_fault_injection.py;
all of them under mpiexec in test_mpi_rank_faults.py.
"""
from __future__ import annotations

import pytest

from fault_injector import run_fault
from fault_outcomes import assert_failed_cleanly

pytestmark = pytest.mark.timeout(150)
WORLD_SIZE = 3
DETECT_LIMIT_S = 20.0


def _cases():
    for fault in ("exit", "raise"):
        for backend in ("tcp", "shm"):
            for victim, where in enumerate(("first", "middle", "last")):
                yield pytest.param(fault, backend, victim, id=f"{fault}-{backend}-{where}")


@pytest.mark.parametrize("fault, backend, victim", list(_cases()))
def test_a_rank_that_leaves_mid_job_is_named_by_every_survivor(fault, backend, victim,
                                                                tmp_path):
    outcome = run_fault(fault, backend, WORLD_SIZE, victim, tmp_path,
                        detect_limit=DETECT_LIMIT_S)
    # The victim left as told, between collectives: none of its own failed.
    assert outcome.exit_codes[victim] == (0 if fault == "exit" else 1), outcome.logs
    assert victim not in outcome.errors, outcome.errors[victim]
    if fault == "raise":
        assert "InjectedError: the training script failed" in outcome.logs
    assert_failed_cleanly(outcome)
