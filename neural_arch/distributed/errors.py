"""Errors raised by the distributed layer.

Every message names the local rank, the peer rank (when there is one), the operation and its
sequence number, so a failure in a 4-rank job can be read from any single rank's log.
"""
from __future__ import annotations

from typing import Optional


class DistributedError(RuntimeError):
    """Base class of every error raised by ``neural_arch.distributed``."""

    def __init__(self, message: str, *, rank: Optional[int] = None, peer: Optional[int] = None,
                 op: Optional[str] = None, seq: Optional[int] = None) -> None:
        self.rank, self.peer, self.op, self.seq = rank, peer, op, seq
        where = []
        if rank is not None:
            where.append(f"rank {rank}")
        if op is not None:
            where.append(f"{op}" + (f" #{seq}" if seq is not None else ""))
        if peer is not None:
            where.append(f"peer rank {peer}")
        prefix = f"[{', '.join(where)}] " if where else ""
        super().__init__(prefix + message)


class CollectiveTimeoutError(DistributedError, TimeoutError):
    """A wait ran past the process group's timeout."""


class PeerFailureError(DistributedError):
    """A peer process died, closed its connection or stopped answering."""


class CollectiveMismatchError(DistributedError):
    """Ranks called different collectives (or the same one with different shapes/dtypes)."""


class RendezvousError(DistributedError):
    """The store could not be reached, or the job's ranks could not find each other."""


class AuthenticationError(DistributedError):
    """A peer did not prove that it knows the job's secret."""
