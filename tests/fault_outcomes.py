"""What a fault injected into the all-reduce job (``fault_injection_job``) must end in: every
survivor raised ``PeerFailureError`` naming itself, the operation with its sequence number and
the failed peer, exited 1 on its own (none returned, none exited 0 with wrong data: the job
checks every result exactly and records a wrong one as an error of its own), and nothing of
the job is left."""
from __future__ import annotations

from fault_injector import FaultOutcome

OP = "all_reduce:sum"


def assert_failed_cleanly(outcome: FaultOutcome, named=None) -> None:
    """``named``: the peers a survivor may blame (default: the victim alone)."""
    named = {outcome.victim} if named is None else set(named)
    for rank in outcome.survivors:
        error = outcome.errors.get(rank)
        assert error is not None, f"rank {rank} reported no error:\n{outcome.logs}"
        assert error["type"] == "PeerFailureError", error
        assert error["op"] == OP and error["peer"] in named, (rank, error)
        assert error["message"].startswith(
            f"[rank {rank}, {OP} #{error['seq']}, peer rank {error['peer']}]"), error
        assert outcome.detection_s(rank) >= 0, (rank, error)  # raised after the injection
    assert outcome.finished == [], f"ranks {outcome.finished} ended their loop normally"
    assert outcome.stuck == [], f"ranks {outcome.stuck} could not exit on their own"
    for rank in outcome.survivors:
        assert outcome.exit_codes[rank] in (1, None), outcome.exit_codes  # None: under mpiexec
    assert outcome.leftover_pids == [], outcome.leftover_pids
    assert outcome.leftover_segments == [], outcome.leftover_segments
