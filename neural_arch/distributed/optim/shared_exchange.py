"""``ZeroRedundancyOptimizer``'s exchange of updated shares on the whole world of an ``shm``
transport: through shared memory instead of an all-gather.

Each rank's share lives in one shared segment (``shared_updates``): on its owner, the
parameters' ``.array`` are views of it, so the local optimizer's step writes the new values
there, and every other rank copies them out after a barrier. An update then costs one copy on
each reader, where the all-gather packed the share, copied it in and out of the transport's
workspace and unpacked it (``sharding.ShardExchange``, used everywhere else). The bits are
the same: the values are copied, never recomputed.

Two barriers after the step order the segment's use: the first waits until every owner's
values are in place, the second until every rank has copied them out, so that no owner
returns from ``step()`` (and its user changes a parameter in place, or the next step
overwrites it) while a peer still reads them.
"""
from __future__ import annotations

from typing import Any, List, Optional

import numpy as np

from .. import collectives
from ..group.shm_world import is_whole_shm_world
from ..group.world import resolve_group
from .back_to_back import BackToBack
from .bucket_assignment import Assignment
from .shared_updates import SharedUpdates
from .sharding import Partition


class SharedShardExchange:
    """Every rank's updated share through one shared segment; see the module docstring.
    Call ``before_step()`` before the local optimizer's step and ``exchange()`` after it."""

    def __init__(self, pieces: List[Assignment], layouts: List[BackToBack],
                 updates: SharedUpdates, rank: int, group: Any) -> None:
        self._pieces, self._layouts, self._updates = pieces, layouts, updates
        self._rank, self._group = rank, group

    @classmethod
    def open(cls, partition: Partition, rank: int, group: Any) -> Optional["SharedShardExchange"]:
        """The exchange on every rank of ``group``, or None on every rank where it cannot
        serve (another transport, a part of the world, parameters off the host, no room in
        shared memory)."""
        pg = resolve_group(group)
        if not is_whole_shm_world(pg):
            return None
        # one piece per owner, group and dtype, in that order: the same on every rank
        # (replicas hold the same shapes)
        pieces: List[Assignment] = []
        on_host = True
        for owner, groups in enumerate(partition):
            for share in groups:
                on_host = on_host and all(type(p.array) is np.ndarray for p in share)
                for dtype in dict.fromkeys(np.dtype(p.array.dtype) for p in share):
                    params = [p for p in share if p.array.dtype == dtype and p.array.size]
                    if params:
                        pieces.append(Assignment(-1, 0, params, owner))
        # a device parameter anywhere: the all-gather handles it, on every rank alike
        if not all(collectives.all_gather_object(on_host, group=pg)):
            return None
        layouts = [BackToBack(piece.params) for piece in pieces]
        updates = SharedUpdates.open(pg, pieces, layouts, rank)
        return None if updates is None else cls(pieces, layouts, updates, rank, group)

    def before_step(self) -> None:
        """This rank's parameters are views of their place in the segment again (a rebound
        ``.array`` is taken in), for the step to update them there."""
        for number, piece in enumerate(self._pieces):
            if piece.rank == self._rank:
                self._updates.before_update(number)

    def exchange(self) -> None:
        """After the step: every other rank's new values into this rank's parameters."""
        for number, piece in enumerate(self._pieces):
            if piece.rank == self._rank:
                self._updates.after_update(number)
        collectives.barrier(group=self._group)
        for number, piece in enumerate(self._pieces):
            if piece.rank != self._rank:
                self._layouts[number].unpack_values(self._updates.place(number))
        collectives.barrier(group=self._group)


__all__ = ["SharedShardExchange"]
