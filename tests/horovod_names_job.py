"""The ranks' side of the Horovod name tests and of their fault-report row: the tensors each
rank submits under a name, and a job in which one rank never submits a name.

Module-level functions, so that the rank harness's workers can import them."""
from __future__ import annotations

import time

import numpy as np


def data(name: str, rank: int) -> np.ndarray:
    """The same shape for every name, so a sum of two names' tensors would go unnoticed."""
    seed = 100 * (ord(name[0]) + len(name)) + rank
    return np.random.default_rng(seed).standard_normal((2, 3))


def rows(rank: int) -> np.ndarray:
    return np.full((rank + 1, 3), float(rank))  # rank r gives r + 1 rows


def missing_name(rank: int, world: int, missing_on: int) -> dict:
    """Every rank but ``missing_on`` submits "a"; all submit "b"; then each waits for its
    handles and averages a metric under the name "loss"."""
    import neural_arch.horovod as hvd
    hvd.init()
    names = ["b"] if rank == missing_on else ["a", "b"]
    handles = [hvd.allreduce_async(data(n, rank), name=n) for n in names]
    start = time.monotonic()
    try:
        for handle in handles:
            hvd.synchronize(handle)
        hvd.allreduce(np.ones(1), name="loss")
        return {"error": None, "seconds": time.monotonic() - start}
    except RuntimeError as exc:
        return {"error": str(exc), "seconds": time.monotonic() - start}
    finally:
        hvd.shutdown()
