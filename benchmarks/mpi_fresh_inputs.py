"""The mpi transport's reduce-scatter and all-gather with inputs reused and with inputs written
before every call, beside MPI's own, in turns.

A benchmark that hands every call the same unchanged buffer flatters any form that sends the
caller's input as it is: with a single-copy transfer (Open MPI's CMA) the peer reads lines that
stay clean in its cache. In a training step the input was just computed (gradients for a
reduce-scatter, updated parameters for an all-gather), and writing memory the peer has just
read costs more than writing memory it has not. Rows, each a batch of calls after a barrier,
in turns, ``ROUNDS`` times (median per call, slowest rank), public calls on the default group:
``plain`` (the same input every call), ``fresh`` (the input filled with a new value inside
each timed call, NumPy's ``fill``), ``fill`` (the fill alone), and MPI_Reduce_scatter_block or
MPI_Allgather the same two ways. Sizes are the collective's input (reduce-scatter) or output
(all-gather), as in ``bench_collectives.py``.

    mpiexec -n 2 python benchmarks/mpi_fresh_inputs.py   (env SIZES=65536,... ROUNDS=5
                                                          COLLECTIVES=reduce_scatter,all_gather)
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from bench_common import mpi_medians_in_turns
from neural_arch import distributed as dist

SIZES = [int(s) for s in os.environ.get("SIZES", "262144,4194304,16777216").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "5"))
COLLECTIVES = os.environ.get("COLLECTIVES", "reduce_scatter,all_gather").split(",")
MOST_CALLS = 300


def rows(comm, collective: str, nbytes: int) -> dict:
    n = comm.Get_size()
    if collective == "reduce_scatter":
        src = np.ones(max(1, nbytes // 4 // n) * n, np.float32)
        out = np.empty(src.size // n, np.float32)

        def ours():
            dist.reduce_scatter_tensor(out, src)

        def theirs():
            comm.Reduce_scatter_block(src, out, op=MPI.SUM)
    elif collective == "all_gather":
        src = np.ones(max(1, nbytes // 4 // n), np.float32)
        out = np.empty(src.size * n, np.float32)

        def ours():
            dist.all_gather_into_tensor(out, src)

        def theirs():
            comm.Allgather(src, out)
    else:
        raise SystemExit(f"COLLECTIVES takes reduce_scatter and all_gather, not {collective!r}")
    value = [0.0]

    def fill():
        value[0] += 1.0
        src.fill(value[0])

    def fresh(call):
        def run():
            fill()
            call()
        return run
    return {"plain": ours, "fresh": fresh(ours), "fill": fill, "MPI plain": theirs,
            "MPI fresh": fresh(theirs)}


def main() -> None:
    dist.init_process_group(backend="mpi", timeout=120)
    comm = MPI.COMM_WORLD.Dup()
    for collective in COLLECTIVES:
        for nbytes in SIZES:
            median = mpi_medians_in_turns(comm, rows(comm, collective, nbytes), nbytes, ROUNDS,
                                          MOST_CALLS)
            if comm.Get_rank() == 0:
                print(f"{collective} p={comm.Get_size()} {nbytes:>9} B: "
                      + ", ".join(f"{name} {seconds * 1e6:.1f} us"
                                  for name, seconds in median.items()), flush=True)
    comm.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
