"""What a pipeline rank does before an error leaves its schedule: make every stage name the one
that failed.

A stage's neighbours find a failed stage themselves (its transport closes), but a stage two
hops away only sees its own neighbour leave, because of the failure, and would blame that
neighbour. The heartbeat (``health.heartbeat``) carries verdicts to every rank of the job, so:

* a rank whose own stage raised declares itself failed through it, with the stage, the pass
  and the error, before the error leaves (where that rank serves the store, rank 0, what its
  neighbours would report could no longer reach anyone once it has gone);
* a rank that failed because the heartbeat told it of a failure elsewhere needs nothing more:
  before its connections close, the heartbeat lingers until every live rank has heard the
  verdict too (``health.monitors``), so a stage waiting on it does not see it leave first.

With the heartbeat off (``NEURAL_ARCH_HEARTBEAT=0``) neither happens: neighbours still name the
failed stage, stages further away their neighbour.
"""
from __future__ import annotations

from typing import Optional

from ..errors import PeerFailureError
from ..health import heartbeat


def before_the_error_leaves(rank: int, exc: BaseException, where: Optional[str] = None) -> None:
    """``where`` (the stage and pass) when this rank's own stage raised ``exc``; None when the
    error came from exchanging messages."""
    if isinstance(exc, PeerFailureError):
        # heard through the heartbeat, or found here and reported on the way (process group)
        return
    if where is None:
        return  # a mismatch found while exchanging: the peer finds it too, and names itself
    first_line = (str(exc).splitlines() or [""])[0][:200]
    heartbeat.report(PeerFailureError(f"the pipeline stage raised {type(exc).__name__}: "
                                      f"{first_line} ({where})", rank=rank, peer=rank,
                                      op="pipeline"))
