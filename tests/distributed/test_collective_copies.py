"""The collectives allocate no copy of their payload per call, on real processes.

Once a shape's buffers exist (two calls of it first), a public all-reduce, broadcast, reduce,
all-gather into a tensor and reduce-scatter of a tensor, 256 KiB on each rank (so that an mpi
all-reduce at two ranks is one swap, ``mpi_wire.SWAP_MAX_BYTES``), must allocate less than an
eighth of that during the call (tracemalloc's peak, which counts NumPy's arrays and Python's
bytes): what they need between calls is kept (the transports' message buffers,
``scratch.thread_scratch``), never made anew. Each result is also checked against NumPy.
The copies it guards against: the mpi swap packing its payload through a temporary bytearray,
the ring's reduce-scatter working on a copy of its input, the tree's reduce receiving into a
new buffer and, below the root, folding into a copy of the vector.
"""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from dist_harness import mpi_available, run_ranks

HAVE_NUMBA = importlib.util.find_spec("numba") is not None

pytestmark = pytest.mark.timeout(120)

NBYTES = 256 << 10


def _peaks_job(rank: int, world: int) -> dict:
    import tracemalloc
    from neural_arch import distributed as dist
    m = NBYTES // 4 // world  # a reduce-scatter's output: the input is world x m float32
    n = m * world
    everyone = [np.arange(n, dtype=np.float32) % 1000 * (r + 1) for r in range(world)]
    total = sum(everyone)
    out = {"all_reduce": np.empty(n, np.float32), "broadcast": np.empty(n, np.float32),
           "reduce": np.empty(n, np.float32), "all_gather": np.empty(world * m, np.float32),
           "reduce_scatter": np.empty(m, np.float32)}

    def call(name: str) -> np.ndarray:
        buf = out[name]
        if name in ("all_reduce", "broadcast", "reduce"):
            np.copyto(buf, everyone[rank])
        if name == "all_reduce":
            dist.all_reduce(buf)
        elif name == "broadcast":
            dist.broadcast(buf, world - 1)
        elif name == "reduce":
            dist.reduce(buf, 0)
        elif name == "all_gather":
            dist.all_gather_into_tensor(buf, everyone[rank][:m])
        else:
            dist.reduce_scatter_tensor(buf, everyone[rank])
        return buf

    want = {"all_reduce": total, "broadcast": everyone[world - 1],
            "reduce": total if rank == 0 else everyone[rank],
            "all_gather": np.concatenate([x[:m] for x in everyone]),
            "reduce_scatter": total[rank * m:(rank + 1) * m]}
    report = {}
    for name in out:
        call(name)
        call(name)
        tracemalloc.start()
        try:
            got = call(name)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        report[name] = (peak, bool(np.array_equal(got, want[name])))
    from neural_arch.distributed.transports import mpi_compiled
    return report, mpi_compiled.loaded()


# the mpi transport's exchanges in each form (``transports.mpi_compiled``), the form fixed from
# the first call: changing over in the middle loads the kernels inside a measured call
CASES = [("shm", 3, ""), ("tcp", 2, ""), ("tcp", 3, "")] + (
    [("mpi", w, form) for form in ("python", "compiled") for w in (2, 3)]
    if mpi_available() else [])


@pytest.mark.parametrize("backend,world,form", CASES,
                         ids=[f"{b}-p{w}{'-' + f if f else ''}" for b, w, f in CASES])
def test_collectives_allocate_no_copy_of_their_payload(backend, world, form):
    env = {"NEURAL_ARCH_MPI_COMPILED": form} if form else {}
    per_rank = run_ranks(_peaks_job, world, backend, timeout=90, init_kwargs={"timeout": 30},
                         env=env)
    for rank, (report, compiled) in enumerate(per_rank):
        assert compiled == (form == "compiled" and HAVE_NUMBA), (rank, form)
        assert all(right for _, right in report.values()), (rank, report)
        copied = {name: peak for name, (peak, _) in report.items() if peak >= NBYTES // 8}
        assert not copied, (rank, copied)
