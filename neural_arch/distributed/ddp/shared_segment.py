"""The shared-memory segment behind ``SharedBucketArena``: where each rank's buckets and slices
lie in it, and how the group creates and maps it.

The segment holds two control lines per rank, then one region per rank with every bucket back
to back (each bucket on its own pages). Rank r reduces slice r of each bucket; slices are
cache-line aligned. Group rank 0 creates the segment and reserves its pages (a full /dev/shm
fails then, with a message, instead of with SIGBUS at a first write), every rank maps it, and
its name is unlinked at once, so nothing outlives the ranks that mapped it.
"""
from __future__ import annotations

import errno
import os
import secrets
from typing import List, Sequence, Tuple

import _posixshmem
import numpy as np

from ..collectives import objects as object_collectives
from ..errors import DistributedError
from ..group.process_group import ProcessGroup
from ..transports.shm import attach_segment, create_segment, unlink_segment
from ..transports.shm.layout import LINE_WORDS, PAGE

Spec = Tuple[int, np.dtype]  # (elements, dtype) of one bucket

ALIGN_BYTES = 64            # slice boundaries fall on cache lines


class SharedBucketsUnavailable(DistributedError):
    """The shared segment could not be set up (e.g. /dev/shm has too little room)."""


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def slices(count: int, p: int, itemsize: int) -> List[Tuple[int, int]]:
    """Each rank's cache-line aligned part of ``count`` elements; the last may be empty."""
    align = max(1, ALIGN_BYTES // itemsize)
    per = round_up(-(-count // p), align)
    return [(min(q * per, count), min((q + 1) * per, count)) for q in range(p)]


class SegmentLayout:
    """Byte offsets in the segment: control lines (the barrier's, one per rank, then one per
    rank of counts of the arena's own), then one region per rank holding every bucket back to
    back (each on its own pages)."""

    def __init__(self, world_size: int, specs: Sequence[Spec]) -> None:
        self.bucket_at, at = [], 0
        for n, dt in specs:
            self.bucket_at.append(at)
            at += round_up(n * np.dtype(dt).itemsize, PAGE)
        self.region_bytes = max(at, PAGE)
        # a control line per rank for the barrier, then one per rank for the arena's counts
        self.ctrl_bytes = round_up(2 * world_size * LINE_WORDS * 8, PAGE)
        self.total_bytes = self.ctrl_bytes + world_size * self.region_bytes

    def bucket(self, rank: int, index: int) -> int:
        return self.ctrl_bytes + rank * self.region_bytes + self.bucket_at[index]


def open_segment(pg: ProcessGroup, total: int, op: str):
    """(name, mapping) of a fresh ``total``-byte segment mapped by every rank of ``pg``; raises
    ``SharedBucketsUnavailable`` on every rank when any rank could not have it."""
    name, mm, problem = None, None, None
    try:
        if pg.rank == 0:
            name = f"nf_{os.getpid()}_{secrets.token_hex(6)}"
            mm, problem = create_reserved(name, total)
        message = [name, problem]
        object_collectives.broadcast_object_list(message, src=pg.ranks[0], group=pg)
        name, problem = message
        if pg.rank != 0 and problem is None:
            try:
                mm = attach_segment(name, total, pg.global_rank)
            except (OSError, DistributedError) as exc:
                problem = f"rank {pg.global_rank} could not map {name}: {exc}"
        problems = object_collectives.all_gather_object(problem, group=pg)
    finally:
        if pg.rank == 0 and name is not None:
            unlink_segment(name)  # every rank has mapped it or given up
    failed = [p for p in problems if p]
    if failed:
        if mm is not None:
            mm.close()
        raise SharedBucketsUnavailable(f"shared buckets of {total} bytes are unavailable: "
                                       + "; ".join(failed), rank=pg.global_rank, op=op)
    return name, mm


def create_reserved(name: str, size: int):
    """Create the segment and reserve its pages now: a full /dev/shm then fails here with a
    message instead of killing a rank with SIGBUS at its first write."""
    try:
        mm = create_segment(name, size)
    except OSError as exc:
        return None, f"rank 0 could not create a {size}-byte segment: {exc}"
    try:
        fd = _posixshmem.shm_open("/" + name, os.O_RDWR, mode=0o600)
        try:
            os.posix_fallocate(fd, 0, size)
        finally:
            os.close(fd)
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):
            return mm, None  # this file system cannot reserve: pages come at first touch
        mm.close()
        unlink_segment(name)
        return None, f"rank 0 could not reserve {size} bytes in /dev/shm ({exc.strerror})"
    return mm, None
