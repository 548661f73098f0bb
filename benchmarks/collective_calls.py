"""The calls ``bench_collectives.py`` times on each rank of a job, with their buffers and checks.

Each ``*_call(collective, buffers)`` returns a function of no arguments that makes one call on
the reused buffers: ours through the public ``neural_arch.distributed`` API, MPI's own through
mpi4py (under mpiexec), the AVERAGE variant of our all-reduce, and the two shm references
(buffer stream, copy exchange); ``fresh_calls`` makes the fresh-data variants of ours and MPI's,
their inputs written before every call. A barrier has no buffers. The rooted collectives
(reduce, gather, scatter) have rank 0 as their root; every rank holds the same buffers, the
root's per-rank lists being views of its whole output (gather) or input (scatter).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List

from collectives_goals import BARRIER

ITEMSIZE = 4  # float32
STREAM_STEP_BYTES = 1 << 20  # the stream's scratch and the exchange's round: stay in cache
LOOP_WARMUP_CALLS = 10


def buffers(collective: str, count: int, p: int) -> Dict[str, Any]:
    import numpy as np
    if collective == BARRIER:
        return {}
    if collective in ("all_gather", "gather"):  # ``count``: the gathered output's
        return {"send": np.zeros(count // p, np.float32), "out": np.zeros(count, np.float32)}
    if collective in ("reduce_scatter", "scatter"):  # ``count``: the input's, as in nccl-tests
        return {"send": np.zeros(count, np.float32), "out": np.zeros(count // p, np.float32)}
    return {"buf": np.zeros(count, np.float32)}


def our_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from neural_arch import distributed as dist
    if collective == BARRIER:
        return dist.barrier
    if collective == "all_reduce":
        return lambda: dist.all_reduce(b["buf"])
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(b["out"], b["send"])
    if collective == "reduce_scatter":
        return lambda: dist.reduce_scatter_tensor(b["out"], b["send"])
    if collective == "reduce":
        return lambda: dist.reduce(b["buf"], dst=0)
    root, p = dist.get_rank() == 0, dist.get_world_size()
    if collective == "gather":  # the root's gather_list: p reused arrays, None elsewhere
        send, gather_list = b["send"], list(b["out"].reshape(p, -1)) if root else None
        return lambda: dist.gather(send, gather_list, dst=0)
    if collective == "scatter":
        out, scatter_list = b["out"], list(b["send"].reshape(p, -1)) if root else None
        return lambda: dist.scatter(out, scatter_list, src=0)
    return lambda: dist.broadcast(b["buf"], src=0)


def average_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from neural_arch import distributed as dist
    op = dist.ReduceOp.AVERAGE  # looked up once, as SUM is (the default argument): two
    return lambda: dist.all_reduce(b["buf"], op)  # attribute lookups a call are 0.1-0.2 us


def time_plain_loop(call: Callable[[], Any], calls: int,
                    warmup: int = LOOP_WARMUP_CALLS) -> List[float]:
    """Seconds of each of ``calls`` calls made back to back (after ``warmup`` untimed ones),
    with no barrier in between: a user's own timing loop."""
    import time
    for _ in range(warmup):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def native_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if collective == BARRIER:
        return comm.Barrier
    if collective == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, b["buf"], op=MPI.SUM)
    if collective == "all_gather":
        return lambda: comm.Allgather(b["send"], b["out"])
    if collective == "reduce_scatter":
        return lambda: comm.Reduce_scatter_block(b["send"], b["out"], op=MPI.SUM)
    root = comm.Get_rank() == 0
    if collective == "reduce":  # in place on the root, as ours; the others' buffers unchanged
        buf = b["buf"]
        if root:
            return lambda: comm.Reduce(MPI.IN_PLACE, buf, op=MPI.SUM, root=0)
        return lambda: comm.Reduce(buf, None, op=MPI.SUM, root=0)
    if collective == "gather":
        send, out = b["send"], b["out"] if root else None
        return lambda: comm.Gather(send, out, root=0)
    if collective == "scatter":
        send, out = b["send"] if root else None, b["out"]
        return lambda: comm.Scatter(send, out, root=0)
    return lambda: comm.Bcast(b["buf"], root=0)


def stream_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    """Read and write the buffer once, through a scratch that stays in cache: the least memory
    traffic of any all-reduce that leaves its result in the caller's buffer."""
    import numpy as np
    buf = b["buf"]
    step = STREAM_STEP_BYTES // ITEMSIZE
    scratch = np.empty(min(step, buf.size), buf.dtype)

    def stream() -> None:
        for lo in range(0, buf.size, step):
            part = buf[lo:lo + step]
            np.copyto(scratch[:part.size], part)
            np.copyto(part, scratch[:part.size])
    return stream


def exchange_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    """Copy the buffer into this rank's area of the shm workspace and the next rank's copy
    back, a round at a time with one barrier each, alternating the workspace's two halves (as
    the direct all-reduce does): its copies at p = 2, without the sums."""
    import numpy as np
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    buf, t = b["buf"], resolve_group(None).transport
    inputs, _ = t.native_collectives().views(buf.dtype)
    step = min(STREAM_STEP_BYTES, t.layout.workspace_bytes) // ITEMSIZE
    mine, peer = t.rank, (t.rank + 1) % t.world_size
    rounds = [0]  # over all calls: a call must not start in the half its last round used

    def exchange() -> None:
        for lo in range(0, buf.size, step):
            part = buf[lo:lo + step]
            areas = inputs[rounds[0] & 1]
            rounds[0] += 1
            np.copyto(areas[mine][:part.size], part)
            dist.barrier()  # the neighbour's copy is complete
            np.copyto(part, areas[peer][:part.size])
    return exchange


def known_block(rank: int, block: int, n: int) -> Any:
    """The ``block``-th block of ``n`` float32 that ``rank`` puts into a checked reduce-scatter,
    reduce (block 0), gather (block 0) or scatter (the root's, rank 0): (rank + 1) * (block + 1)
    + position % 1024, so that a missing rank, a block summed into or sent to the wrong rank or
    an element moved within its block changes the result (integers below 2^24 for any p the
    benchmark runs: exact in float32, in any order of summation)."""
    import numpy as np
    return ((rank + 1) * (block + 1) + np.arange(n, dtype=np.int32) % 1024).astype(np.float32)


def check(collective: str, b: Dict[str, Any], call: Callable[[], Any], rank: int,
           p: int, average: bool = False) -> None:
    """One call on known inputs must give the known result; then every buffer is zeroed, so
    that the timed sums stay finite (and every page is written, not a shared zero page). A
    barrier carries no data: that it returns on every rank is its check."""
    import numpy as np
    if collective == BARRIER:
        call()
        return
    if collective == "all_reduce":
        b["buf"][...] = rank + 1
        got, expected = b["buf"], np.float32(p * (p + 1) / 2 / (p if average else 1))
    elif collective == "all_gather":
        b["send"][...] = rank + 1
        got = b["out"]
        expected = np.repeat(np.arange(1, p + 1, dtype=np.float32), b["send"].size)
    elif collective == "reduce_scatter":
        n = b["out"].size
        b["send"][...] = np.concatenate([known_block(rank, k, n) for k in range(p)])
        got = b["out"]
        expected = np.sum([known_block(r, rank, n) for r in range(p)], axis=0,
                          dtype=np.float32)
    elif collective == "reduce":  # into the root; the others' buffers unchanged
        n = b["buf"].size
        b["buf"][...] = known_block(rank, 0, n)
        got = b["buf"]
        expected = np.sum([known_block(r, 0, n) for r in range(p)], axis=0, dtype=np.float32) \
            if rank == 0 else known_block(rank, 0, n)
    elif collective == "gather":  # the root's output in rank order; the others send only
        n = b["send"].size
        b["send"][...] = known_block(rank, 0, n)
        b["out"][...] = -1.0  # a block the root never wrote shows
        got = b["out"] if rank == 0 else b["send"]
        expected = np.concatenate([known_block(r, 0, n) for r in range(p)]) if rank == 0 \
            else known_block(rank, 0, n)
    elif collective == "scatter":  # block ``rank`` of the root's input; the others' unread
        n = b["out"].size
        b["send"][...] = np.concatenate([known_block(0, k, n) for k in range(p)]) \
            if rank == 0 else -1.0
        got, expected = b["out"], known_block(0, rank, n)
    else:
        b["buf"][...] = 7.0 if rank == 0 else -1.0
        got, expected = b["buf"], np.float32(7.0)
    call()
    if not np.array_equal(got, np.broadcast_to(expected, got.shape)):
        nbytes = max(array.nbytes for array in b.values())  # the size the tables name
        raise RuntimeError(f"{collective} of {nbytes} B on rank {rank} of {p} gave "
                           f"{got[:4]}..., expected {np.ravel(expected)[:4]}...")
    for array in b.values():
        array[...] = 0
