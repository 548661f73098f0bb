"""Where a two-rank all-reduce on the mpi transport spends its time, layer by layer, in turns.

Rows, each timed in batches after a barrier, in turns with every other row, ``ROUNDS`` times
(median per call, slowest rank): ``public`` (``dist.all_reduce``, which after a shape's first
call runs that shape's short entry, ``group.short_calls``), ``portable`` (the algorithm the
public call chooses, ``algorithms.all_reduce``, without the layers above it: recursive
doubling below 64 KiB, so that the gap to ``public`` is what those layers cost), ``planned``
(the plan the public call's entry runs for the shape, ``algorithms.all_reduce_plan``: below
64 KiB the round of recursive doubling prepared once, ``MpiTransport.exchange_reduce_plan``,
so that the gap to ``public`` is what the entry costs), ``algorithm``
(the transport's two-rank all-reduce, ``ring_all_reduce``, without the layers above it),
``swap`` (its whole-vector exchange at every size), ``sendrecv``
(the transport's exchange alone, no reduction), then bare mpi4py: ``bare wire`` (the messages
the wire sends for a ``sendrecv``: the header, packed with a payload of up to 8 KiB, else
followed by the payload, then the sum into the receive buffer), ``bare Sendrecv+add`` (one
Sendrecv, the sum into the receive buffer), ``bare in place`` (the same, the sum written into
the sent buffer, as an all-reduce must), ``bare copy in place`` (a copy sent instead: what
``mpi_swap`` does) and ``MPI`` (``MPI_Allreduce``).

The swaps run in one compiled call once hot (``transports.mpi_compiled``);
``NEURAL_ARCH_MPI_COMPILED=python`` times their mpi4py form instead.

    mpiexec -n 2 python benchmarks/mpi_layers.py      (env SIZES=4,65536,1048576 ROUNDS=9)
"""
from __future__ import annotations

import os

import numpy as np
from mpi4py import MPI

from bench_common import mpi_medians_in_turns
from neural_arch import distributed as dist
from neural_arch.distributed import algorithms
from neural_arch.distributed.group.world import resolve_group
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import mpi_pair, mpi_wire
from neural_arch.distributed.transports.base import HEADER_SIZE, Fingerprint, pack_header

SIZES = [int(s) for s in os.environ.get("SIZES", "4,65536,1048576").split(",")]
ROUNDS = int(os.environ.get("ROUNDS", "9"))
MOST_CALLS = 2000  # a batch's calls at the smallest sizes


def rows(comm, bare, transport, buf: np.ndarray) -> dict:
    peer = 1 - comm.Get_rank()
    got = np.empty_like(buf)
    fp = Fingerprint("bench", 1, buf.dtype.str, buf.size)
    header = pack_header(fp, buf.nbytes)
    first = bytearray(HEADER_SIZE + min(buf.nbytes, mpi_wire.PACKED_MAX_BYTES))

    def bare_wire():
        if buf.nbytes <= mpi_wire.PACKED_MAX_BYTES:
            packed = bytearray(header) + memoryview(buf).cast("B")
            reqs = [bare.Irecv([first, MPI.BYTE], peer, 7), bare.Isend([packed, MPI.BYTE], peer, 7)]
            MPI.Request.Waitall(reqs)
            got.view(np.uint8)[:] = memoryview(first)[HEADER_SIZE:]
        else:
            reqs = [bare.Irecv([first, MPI.BYTE], peer, 7), bare.Irecv(got, peer, 7),
                    bare.Isend([bytearray(header), MPI.BYTE], peer, 7), bare.Isend(buf, peer, 7)]
            MPI.Request.Waitall(reqs)
        np.add(got, buf, out=got)

    def bare_sendrecv():
        bare.Sendrecv(buf, peer, 8, got, peer, 8)
        np.add(got, buf, out=got)

    def bare_in_place():
        bare.Sendrecv(buf, peer, 8, got, peer, 8)
        np.add(got, buf, out=buf)

    copy = np.empty_like(buf)

    def bare_copy_in_place():
        np.copyto(copy, buf)
        bare.Sendrecv(copy, peer, 8, got, peer, 8)
        np.add(got, buf, out=buf)

    plan = algorithms.all_reduce_plan(transport, buf.dtype, buf.nbytes, ReduceOp.SUM)
    return {"public": lambda: dist.all_reduce(buf),
            "portable": lambda: algorithms.all_reduce(transport, buf, ReduceOp.SUM, fp),
            "planned": lambda: plan(buf, fp),
            "algorithm": lambda: transport.ring_all_reduce(buf, ReduceOp.SUM, fp),
            "swap": lambda: mpi_pair.exchange_all_reduce(transport, buf, -(-buf.size // 2),
                                                         ReduceOp.SUM, fp, 0),
            "sendrecv": lambda: transport.sendrecv(buf, peer, got, peer, fp),
            "bare wire": bare_wire, "bare Sendrecv+add": bare_sendrecv,
            "bare in place": bare_in_place, "bare copy in place": bare_copy_in_place,
            "MPI": lambda: comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)}


def main() -> None:
    dist.init_process_group(backend="mpi", timeout=120)
    comm, transport = MPI.COMM_WORLD, resolve_group(None).transport
    if comm.Get_size() != 2:
        raise SystemExit(f"run with mpiexec -n 2 (this job has {comm.Get_size()} ranks)")
    bare = comm.Dup()
    for nbytes in SIZES:
        buf = np.zeros(max(1, nbytes // 4), np.float32)
        median = mpi_medians_in_turns(comm, rows(comm, bare, transport, buf), nbytes, ROUNDS,
                                      MOST_CALLS)
        if comm.Get_rank() == 0:
            print(f"{nbytes:>9} B: " + ", ".join(f"{name} {seconds * 1e6:.1f} us"
                                                  for name, seconds in median.items()), flush=True)
    bare.Free()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
