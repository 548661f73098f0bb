"""Whether a group is the whole world of an ``shm`` transport: every rank of the job, on one
host, with the transport's shared workspace open.

Shared-memory shortcuts (DDP's shared buckets, ZeRO's shared exchange of updated shares) map
one segment on every rank of the transport, so they serve only such a group: a subgroup's
collectives run on some of the ranks only, and another transport has no segment to share.
"""
from __future__ import annotations

from .process_group import ProcessGroup


def is_whole_shm_world(pg: ProcessGroup) -> bool:
    """True when ``pg`` spans every rank of an open ``shm`` transport (its native collectives
    are there: a closed transport has none)."""
    t = pg.transport
    return (t is not None and t.name == "shm" and t.world_size == pg.size
            and t.native_collectives() is not None)


__all__ = ["is_whole_shm_world"]
