"""The check that every rank of a group made the same call with the same arguments.

It lives with the groups because ``new_group`` needs it before any collective above the groups
exists; the collectives (DDP's bucket layout, ``collectives.objects``) use it too.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import algorithms
from .process_group import ProcessGroup


def check_same_everywhere(pg: ProcessGroup, op: str, values: Sequence[int], what: str) -> None:
    """ValueError on every rank unless all ranks passed the same ``values``."""
    mine = np.ascontiguousarray(np.asarray(values, dtype=np.int64).reshape(-1))
    fp = pg.fingerprint(op, mine.dtype, mine.size)
    rows = np.empty((pg.size, mine.size), dtype=np.int64)
    pg.run(lambda: algorithms.all_gather(pg.transport, mine, rows.reshape(-1), fp), False, fp, op)
    differ = [pg.ranks[i] for i in range(pg.size) if not np.array_equal(rows[i], rows[0])]
    if differ:
        raise ValueError(f"{what}: ranks {differ} passed different arguments than rank "
                         f"{pg.ranks[0]} (every rank must make the same call)")
