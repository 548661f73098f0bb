"""Storage for DDP's flat gradient buckets: private arrays, or buckets in shared memory.

``bucket_storage`` gives DDP one flat array per bucket. By default they are private arrays and
each bucket is averaged by ``collectives.all_reduce``. When the group is the whole world of an
``shm`` transport, a ``shm_buckets.SharedBucketArena`` serves instead, averaging the buckets
in place in one shared segment.
"""
from __future__ import annotations

import zlib
from typing import Optional, Sequence

import numpy as np

from .. import object_collectives
from ..algorithms.shm_direct import supports_direct
from ..group.world import ProcessGroup, resolve_group
from ..shm_buckets import SharedBucketArena, SharedBucketsUnavailable, Spec


class PrivateBuckets:
    """One private zeroed array per bucket; DDP all-reduces them through the collectives."""

    shared = False

    def __init__(self, specs: Sequence[Spec]) -> None:
        self.flats = [np.zeros(n, dtype=dt) for n, dt in specs]


def shared_bucket_obstacle(pg: ProcessGroup, specs: Sequence[Spec],
                           gradient_compression: bool) -> Optional[str]:
    """Why shared buckets cannot serve this DDP, or None when they can."""
    if gradient_compression:
        return "gradient_compression=True all-reduces float16 copies, not the buckets"
    t = pg.transport
    if not supports_direct(t) or t.world_size != pg.size:
        return (f"the group (ranks {list(pg.ranks)}, backend {pg.backend!r}) is not the whole "
                "world of an shm transport")
    for n, dt in specs:
        if np.dtype(dt).kind != "f":
            return f"a bucket of {n} x {np.dtype(dt).name} cannot be averaged"
    return None


def bucket_storage(group: Optional[ProcessGroup], specs: Sequence[Spec],
                   shared: Optional[bool] = None, gradient_compression: bool = False):
    """The flat arrays of DDP's buckets: a ``SharedBucketArena`` or ``PrivateBuckets``.

    ``shared``: None picks shared buckets whenever they can serve (falling back to private
    ones when the segment cannot be set up), True insists (ValueError naming the obstacle),
    False never uses them. Every rank must pass the same value and bucket layout.
    """
    if shared is not None and not isinstance(shared, bool):
        raise TypeError(f"shared_buckets must be None, True or False, got {shared!r}")
    specs = [(int(n), np.dtype(dt)) for n, dt in specs]
    pg = resolve_group(group)
    if pg.size == 1:
        return PrivateBuckets(specs)  # nothing to communicate
    layout = zlib.crc32(repr([(n, dt.str) for n, dt in specs]).encode())
    object_collectives.check_same_everywhere(
        pg, "ddp_bucket_layout", [{None: 0, False: 1, True: 2}[shared], layout],
        f"DistributedDataParallel buckets (shared_buckets={shared}, {len(specs)} buckets)")
    obstacle = shared_bucket_obstacle(pg, specs, gradient_compression)
    if obstacle is not None:
        if shared:
            raise ValueError(f"shared_buckets=True cannot be used: {obstacle}")
        return PrivateBuckets(specs)
    if shared is False:
        return PrivateBuckets(specs)
    try:
        return SharedBucketArena.open(pg, specs)
    except SharedBucketsUnavailable:
        if shared:
            raise
        return PrivateBuckets(specs)  # every rank saw the same failure
