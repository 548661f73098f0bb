"""The mpi transport's two-rank all-reduce in each of its forms, and MPI_Allreduce, in turns.

Forms (``transports/mpi_pair.py``): ``shipped`` (what ``dist.all_reduce`` runs: one swap of the
whole vector up to EXCHANGE_MAX_BYTES, two exchanges of whole halves above it), ``swap`` (one
exchange of the whole vector at every size: the transport's packed ``swap`` up to
``mpi_wire.SWAP_MAX_BYTES``, a ``sendrecv`` above), ``halves`` (the two exchanges of halves at
every size), ``pipeline`` (the pipeline at every size, PIECES_PER_HALF pieces a half),
``pipeline8`` (8 pieces a half), ``ring`` (the portable ring over the same transport),
``steps apart`` (the halves' two exchanges with the fold between them in NumPy, where
``halves`` folds inside the compiled call once hot) and ``bare ring`` (the halves' two steps
in bare mpi4py: what the transport's messages add). Every form and MPI_Allreduce run a batch
of calls in turn, ``ROUNDS`` times after one warm-up batch;
printed: the median per-call time of each (slowest rank) and MPI's time over each form's. The
thresholds in ``mpi_pair`` come from this table.

    mpiexec -n 2 python benchmarks/mpi_pair_forms.py     (env SIZES=65536,... ROUNDS=9)
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from bench_common import mpi_medians_in_turns
from neural_arch import distributed as dist
from neural_arch.distributed.group.world import resolve_group
from neural_arch.distributed.transports import mpi_pair
from neural_arch.distributed.transports.base import Fingerprint

SIZES = [int(s) for s in os.environ.get("SIZES", "65536,262144,1048576,4194304,16777216")
         .split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "9"))
MOST_CALLS = 1000  # a batch's calls at the smallest sizes
FORMS = {"shipped": {}, "swap": {"EXCHANGE_MAX_BYTES": 1 << 62},
         "halves": {"EXCHANGE_MAX_BYTES": 0, "PIPELINE_MIN_BYTES": 1 << 62},
         "pipeline": {"EXCHANGE_MAX_BYTES": 0, "PIPELINE_MIN_BYTES": 0},
         "pipeline8": {"EXCHANGE_MAX_BYTES": 0, "PIPELINE_MIN_BYTES": 0, "PIECES_PER_HALF": 8}}


def with_settings(buf: np.ndarray, settings: dict):
    def call():
        saved = {name: getattr(mpi_pair, name) for name in settings}
        for name, value in settings.items():
            setattr(mpi_pair, name, value)
        try:
            dist.all_reduce(buf)
        finally:
            for name, value in saved.items():
                setattr(mpi_pair, name, value)
    return call


def portable_ring(buf: np.ndarray, transport):
    def call():
        transport.ring_all_reduce = lambda *args: False  # the Transport default
        try:
            dist.all_reduce(buf)
        finally:
            del transport.ring_all_reduce
    return call


def steps_apart(buf: np.ndarray, transport):
    """The halves' two steps as the transport's two ``sendrecv``s with a NumPy fold between
    (``ring_steps`` given a fold the kernels do not take): against ``halves``, what keeping the
    fold inside one compiled call is worth."""
    rank, half = transport.rank, -(-buf.size // 2)
    mine, theirs = (buf[:half], buf[half:]) if rank == 0 else (buf[half:], buf[:half])
    got = np.empty_like(mine)
    fp = Fingerprint("steps apart", 0, buf.dtype.name, buf.size)
    return lambda: transport.ring_steps(mine, theirs, got, fp,
                                        lambda got: np.add(got, mine, out=mine))


def bare_ring(buf: np.ndarray, comm):
    """The halves' two steps in bare mpi4py, the ring's operand order: what the transport's
    messages (header, checks, the poll) add to the same algorithm."""
    rank, peer, half = comm.Get_rank(), 1 - comm.Get_rank(), -(-buf.size // 2)
    mine, theirs = (buf[:half], buf[half:]) if rank == 0 else (buf[half:], buf[:half])
    got = np.empty_like(mine)

    def call():
        request = comm.Irecv(got, peer, 9)
        comm.Send(theirs, peer, 9)
        request.Wait()
        np.add(got, mine, out=mine)
        request = comm.Irecv(theirs, peer, 10)
        comm.Send(mine, peer, 10)
        request.Wait()
    return call


def main() -> None:
    dist.init_process_group(backend="mpi", timeout=120)
    comm, transport = MPI.COMM_WORLD, resolve_group(None).transport
    if comm.Get_size() != 2:
        raise SystemExit(f"run with mpiexec -n 2 (this job has {comm.Get_size()} ranks)")
    bare = comm.Dup()
    for nbytes in SIZES:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        calls = {name: with_settings(buf, settings) for name, settings in FORMS.items()}
        calls["ring"] = portable_ring(buf, transport)
        calls["steps apart"] = steps_apart(buf, transport)
        calls["bare ring"] = bare_ring(buf, bare)
        calls["MPI"] = lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        median = mpi_medians_in_turns(comm, calls, nbytes, ROUNDS, MOST_CALLS)
        if comm.Get_rank() == 0:
            print(f"{nbytes:>9} B: " + ", ".join(f"{name} {median[name] * 1e6:.1f} us"
                                                  for name in calls)
                  + " | MPI / form: " + ", ".join(f"{name} {median['MPI'] / median[name]:.2f}x"
                                                  for name in calls if name != "MPI"),
                  flush=True)
    bare.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
