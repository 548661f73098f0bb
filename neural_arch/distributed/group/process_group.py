"""A process group: a set of ranks that run collectives together over one transport.

Each group numbers its collectives (the sequence number in every fingerprint) and its
point-to-point messages per peer, translates global ranks to its own, and runs calls in issue
order on the job's queue, synchronously or as ``Work``. ``world`` builds the default
group at ``init_process_group`` and subgroups in ``new_group``.
"""
from __future__ import annotations

import itertools
import threading
from typing import Any, Optional, Sequence

import numpy as np

from .. import profiler
from ..errors import DistributedError, PeerFailureError
from ..health import heartbeat
from ..transports.base import Fingerprint, Transport
from ..work import CommQueue, Work
from .subgroup_transport import SoloTransport

_DTYPE_NAMES: dict = {}

# ``Fingerprint(...)`` without the keyword-taking ``__new__`` that ``NamedTuple`` writes in
# Python: the same tuple, built at C speed, on every collective.
_new_fingerprint = tuple.__new__


def _dtype_name(dtype: Any) -> str:
    """``np.dtype(dtype).name``, cached: it is surprisingly slow and runs on every collective."""
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = np.dtype(dtype).name
    return name


class ProcessGroup:
    """A set of ranks that run collectives together (the default group holds every rank)."""

    def __init__(self, group_id: int, ranks: Sequence[int], global_rank: int,
                 transport: Optional[Transport], queue: CommQueue, backend: str, timeout: float,
                 trusted: bool) -> None:
        self.group_id, self.ranks = group_id, tuple(ranks)
        self.rank = self.ranks.index(global_rank) if global_rank in self.ranks else -1
        self.global_rank = global_rank
        self.size = len(self.ranks)
        if transport is None and self.size == 1 and self.rank == 0:
            transport = SoloTransport(timeout)
        self.transport, self.queue = transport, queue
        self.backend, self.timeout, self.trusted = backend, timeout, trusted
        self.destroyed = False
        # the next collective's sequence number; atomic under the GIL: no lock per call
        self.next_seq = itertools.count(1).__next__
        self._p2p: dict[tuple[str, int], int] = {}
        self._lock = threading.Lock()

    @property
    def is_member(self) -> bool:
        return self.rank >= 0

    def check_usable(self, op: str) -> None:
        if self.destroyed:
            raise DistributedError(f"group {self.group_id} was destroyed", rank=self.global_rank,
                                   op=op)
        if not self.is_member:
            raise ValueError(f"rank {self.global_rank} is not a member of group {self.group_id} "
                             f"(ranks {list(self.ranks)}) and cannot call {op} on it")

    def fingerprint(self, op: str, dtype: Any, count: int) -> Fingerprint:
        """Fingerprint of the next collective; the sequence number advances on every member."""
        return _new_fingerprint(Fingerprint, (op[:24], self.next_seq(), _dtype_name(dtype),
                                              int(count), self.group_id))

    def p2p_fingerprint(self, direction: str, peer: int, op: str, dtype: Any,
                        count: int) -> Fingerprint:
        """Point-to-point messages are numbered per peer, apart from the group's collectives."""
        with self._lock:
            key = (direction, peer)
            self._p2p[key] = seq = self._p2p.get(key, 0) + 1
        return Fingerprint(op[:24], seq, _dtype_name(dtype), int(count), self.group_id)

    def group_rank_of(self, global_rank: Any, what: str) -> int:
        """Translate a global rank argument (``src``/``dst``, as in PyTorch) to a group rank."""
        if isinstance(global_rank, bool) or not isinstance(global_rank, (int, np.integer)):
            raise TypeError(f"{what} must be an int rank, got {global_rank!r}")
        if global_rank not in self.ranks:
            if self.group_id == 0:
                raise ValueError(f"{what}={global_rank} is out of range for world size "
                                 f"{self.size}")
            raise ValueError(f"{what}={global_rank} is not in group {self.group_id} "
                             f"(ranks {list(self.ranks)})")
        return self.ranks.index(int(global_rank))

    def run(self, fn, async_op: bool, fp: Optional[Fingerprint], op: str):
        """Run ``fn`` now (after pending async work) or queue it and return a ``Work``."""
        seq = fp.seq if fp is not None else None
        if profiler.TRACER is not None:  # the profiler hook: wrapped only while one records
            fn = profiler.trace_collective(fn, op, fp)
        if self.size == 1:
            result = fn()
            return Work.completed(op, result, self.global_rank) if async_op else result
        if async_op:  # a failure found here is reported so that peers name the culprit
            return self.queue.submit(heartbeat.reporting(fn), op, seq)
        return self.run_now(fn, op, seq)

    def run_now(self, fn, op: str, seq: Optional[int], *args: Any) -> Any:
        """``fn(*args)`` on this thread after pending async work; a peer failure found on the
        way is reported (so that peers name the culprit), then raised."""
        try:
            return self.queue.run_sync(fn, op, seq, *args)
        except PeerFailureError as exc:
            heartbeat.report(exc)
            raise

    def __repr__(self) -> str:
        return (f"ProcessGroup(id={self.group_id}, ranks={list(self.ranks)}, rank={self.rank}, "
                f"backend={self.backend!r})")
