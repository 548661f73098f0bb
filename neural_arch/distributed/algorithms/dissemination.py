"""Dissemination barrier: in round k every rank signals rank + 2**k and hears from rank - 2**k.

After ceil(log2 n) rounds each rank has (transitively) heard from every other rank, so none can
leave before all have arrived.
"""
from __future__ import annotations

import numpy as np

from ..transports.base import Fingerprint, Transport


def barrier(t: Transport, fp: Fingerprint) -> None:
    n, r = t.world_size, t.rank
    token = np.ones(1, dtype=np.uint8)
    heard = np.empty(1, dtype=np.uint8)
    distance = 1
    while distance < n:
        t.sendrecv(token, (r + distance) % n, heard, (r - distance) % n, fp)
        distance <<= 1
