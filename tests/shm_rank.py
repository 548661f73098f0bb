"""One rank's shared-memory transport inside a worker that ``shm_testing.run_ranks`` runs:
opened from the worker's own arguments and closed however the worker leaves (a returned value,
an error to report), so that no segment outlives the rank."""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from neural_arch.distributed.transports import shm


@contextmanager
def rank_transport(rank: int, p: int, store: Any, timeout: float, **options: Any) -> Iterator:
    """``shm.create(rank, p, store, timeout, **options)``, closed when the block ends."""
    t = shm.create(rank, p, store, timeout, **options)
    try:
        yield t
    finally:
        t.close()
