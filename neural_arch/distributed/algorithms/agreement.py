"""Agreeing on the root before a rooted collective moves any data.

The messages of the binomial trees (``tree``) carry the root in their fingerprint, but ranks
that disagree on the root build different trees, and then no header is ever compared: two
"roots" of a broadcast or scatter only send and return with different data, two roots of a
reduce or gather each wait for the other until the timeout. So every rank first learns every
rank's root, by dissemination: in round k it sends what it knows to rank + 2**k and hears from
rank - 2**k, and after ceil(log2 n) rounds it knows all n roots. Ranks that passed different
roots then all raise the same ``CollectiveMismatchError``, naming each rank's root, before any
data moves; every message of the exchange has been received, so the group stays usable.

The exchange carries the collective's fingerprint without the root, so a rank that called
another collective altogether is still named by the header check, and costs ceil(log2 n)
small messages per rank, once per rooted collective. At two ranks it is one exchange of the
roots (``transports.base.swap_with_root`` with no payload), the message the tcp transport's
own two-rank broadcast sends before a large payload too.
"""
from __future__ import annotations

import numpy as np

from ..transports.base import Fingerprint, Transport, check_roots, split_root, swap_with_root


def agree_on_root(t: Transport, root: int, fp: Fingerprint) -> None:
    """Return once every rank of ``t`` is known to have passed ``root``; otherwise raise
    CollectiveMismatchError on every rank, naming the root each rank passed."""
    n, rank = t.world_size, t.rank
    if not 0 <= root < n:
        raise ValueError(f"root rank {root} is out of range for world size {n}")
    if n == 1:
        return
    if n == 2:  # the claim alone, as the two-rank forms send it in front of their data
        swap_with_root(t, root, fp, None, 0)
        return
    name, named = split_root(fp.op)
    exchange = fp if named is None else fp._replace(op=name)
    known = np.full(n, -1, dtype=np.int64)  # -1: not heard of yet
    known[rank] = root
    heard = np.empty(n, dtype=np.int64)
    distance = 1
    while distance < n:
        t.sendrecv(known, (rank + distance) % n, heard, (rank - distance) % n, exchange)
        np.copyto(known, heard, where=known < 0)
        distance <<= 1
    check_roots(known.tolist(), fp, t)
