"""Collective time and bandwidth per backend, with MPI's own collectives measured beside ours.

For each backend (shm, tcp, mpi) and world size, every rank is a real process (our launcher
for shm/tcp, mpiexec for mpi). Each point is timed in batches of calls, each batch right after a
barrier; a rank's time is the median per-call time over batches, the reported time the slowest
rank's. The whole set of jobs runs ``--repeats`` times, interleaved, and each point reports the
median over those runs: on a shared machine a job's speed drifts over minutes, and one run of
ours against one of MPI's would compare moments rather than implementations. Every collective
runs 4 B to 256 MiB by 4x unless ``--sizes`` says otherwise. Sizes and bandwidths follow
nccl-tests: an all-gather's size is its gathered output (each rank sends size / p); algbw =
bytes / time; busbw = algbw * 2(p-1)/p for all-reduce, * (p-1)/p for all-gather, * 1 for
broadcast. Under mpiexec, mpi4py's ``Allreduce``/``Allgather``/``Bcast`` run on the same
reused buffers. In the shm jobs a ``buffer stream`` row bounds all-reduces from 1 MiB: every
rank reads and writes its own buffer once through a cache-sized scratch, all at once, which no
all-reduce that leaves its result in the caller's buffer can beat on the same machine; and a
``copy exchange`` row times the copies the direct all-reduce makes at p = 2 without its sums:
every rank copies its buffer into its area of the shared workspace and its neighbour's copy
back, a round at a time, so it shows how fast data moves between the cores in that job. Two
more shm rows from 1 MiB show what users see: ``shm AVERAGE`` (the op DDP uses) and ``shm
plain loop`` (calls timed one by one in a plain loop, no barrier between them).

    python benchmarks/bench_collectives.py [--backends shm,tcp,mpi] [--world-sizes 2,4]
        [--sizes 4,1K,16M] [--max-size 256M] [--iters 20] [--repeats 3]
        [--output benchmarks/RESULTS.md]
        [--plot docs/collectives_bandwidth.png]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
# the report's names are also used as bench_collectives.<name> by other scripts and tests
from collectives_report import (AVERAGE, COLLECTIVES, EXCHANGE, LOOP, NATIVE,  # noqa: E402,F401
                                STREAM,
                                bandwidths, bus_factor, goals, median_over_runs, plot, report,
                                tables)

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: E402

# 4 B .. 256 MiB by 4x for every collective; an all-gather's size is its gathered output, as in
# nccl-tests (each rank sends size / p), so 256 MiB is 256 MiB out and 256 / p MiB in per rank
DEFAULT_SIZES = {c: [4 ** k for k in range(1, 15)] for c in COLLECTIVES}
NATIVE_NAMES = {"all_reduce": "MPI_Allreduce", "all_gather": "MPI_Allgather",
                "broadcast": "MPI_Bcast"}
ITEMSIZE = 4  # float32
BATCH_BYTES = 1 << 20      # small messages run in batches of calls up to about this many bytes
MAX_CALLS_PER_BATCH = 50
REPEAT_BYTES = 1 << 30     # large messages: fewer batches, about this many bytes in all
MIN_BATCHES = 5
STREAM_MIN_BYTES = 1 << 20  # the buffer stream and copy exchange: all-reduces this large
STREAM_STEP_BYTES = 1 << 20  # the stream's scratch and the exchange's round: stay in cache
REFERENCES = (STREAM, EXCHANGE)
VARIANTS = (AVERAGE, LOOP)   # our all-reduce as users call it, beside the batched SUM
LOOP_WARMUP_CALLS = 10
SECTION = "bench_collectives"
SCRIPT = os.path.abspath(__file__)


def element_count(collective: str, nbytes: int, p: int) -> int:
    """float32 elements of the message (for all-gather: of the gathered total, a multiple of p)."""
    unit = ITEMSIZE * (p if collective == "all_gather" else 1)
    return max(1, nbytes // unit) * unit // ITEMSIZE


def message_counts(collective: str, sizes: Sequence[int], p: int) -> List[int]:
    """The distinct element counts of ``sizes`` (tiny all-gathers round up to one float32 per
    rank, so e.g. 4 B and 16 B are the same 16-byte message at p = 4: timed once)."""
    return sorted({element_count(collective, nbytes, p) for nbytes in sizes})


def schedule(nbytes: int, iters: int) -> Tuple[int, int]:
    """(calls per batch, timed batches) for a message of ``nbytes``."""
    calls = max(1, min(MAX_CALLS_PER_BATCH, BATCH_BYTES // nbytes))
    batches = max(min(MIN_BATCHES, iters), min(iters, REPEAT_BYTES // (nbytes * calls)))
    return calls, batches


# ----- one rank of a job ---------------------------------------------------------------------
def _buffers(collective: str, count: int, p: int) -> Dict[str, Any]:
    import numpy as np
    if collective == "all_gather":
        return {"send": np.zeros(count // p, np.float32), "out": np.zeros(count, np.float32)}
    return {"buf": np.zeros(count, np.float32)}


def _our_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from neural_arch import distributed as dist
    if collective == "all_reduce":
        return lambda: dist.all_reduce(b["buf"])
    if collective == "all_gather":
        return lambda: dist.all_gather_into_tensor(b["out"], b["send"])
    return lambda: dist.broadcast(b["buf"], src=0)


def _average_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from neural_arch import distributed as dist
    return lambda: dist.all_reduce(b["buf"], dist.ReduceOp.AVERAGE)


def time_plain_loop(call: Callable[[], Any], calls: int) -> List[float]:
    """Seconds of each of ``calls`` calls made back to back (after LOOP_WARMUP_CALLS untimed
    ones), with no barrier in between: a user's own timing loop."""
    import time
    for _ in range(LOOP_WARMUP_CALLS):
        call()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _native_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if collective == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, b["buf"], op=MPI.SUM)
    if collective == "all_gather":
        return lambda: comm.Allgather(b["send"], b["out"])
    return lambda: comm.Bcast(b["buf"], root=0)


def _stream_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
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


def _exchange_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
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


def _check(collective: str, b: Dict[str, Any], call: Callable[[], Any], rank: int,
           p: int, average: bool = False) -> None:
    """One call on known inputs must give the known result; then every buffer is zeroed, so
    that the timed sums stay finite (and every page is written, not a shared zero page)."""
    import numpy as np
    if collective == "all_reduce":
        b["buf"][...] = rank + 1
        got, expected = b["buf"], np.float32(p * (p + 1) / 2 / (p if average else 1))
    elif collective == "all_gather":
        b["send"][...] = rank + 1
        got = b["out"]
        expected = np.repeat(np.arange(1, p + 1, dtype=np.float32), b["send"].size)
    else:
        b["buf"][...] = 7.0 if rank == 0 else -1.0
        got, expected = b["buf"], np.float32(7.0)
    call()
    if not np.array_equal(got, np.broadcast_to(expected, got.shape)):
        raise RuntimeError(f"{collective} of {got.nbytes} B on rank {rank} of {p} gave "
                           f"{got[:4]}..., expected {np.ravel(expected)[:4]}...")
    for array in b.values():
        array[...] = 0


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.group.world import resolve_group
    rank, p, backend = dist.get_rank(), dist.get_world_size(), job["backend"]
    transport = resolve_group(None).transport
    impls: List[Tuple[str, Callable, Callable[[], Any]]] = [(backend, _our_call, dist.barrier)]
    if backend == "mpi":
        from mpi4py import MPI
        impls.append((NATIVE, _native_call, MPI.COMM_WORLD.Barrier))
    if backend == "shm":
        impls += [(AVERAGE, _average_call, dist.barrier), (LOOP, _our_call, None),
                  (STREAM, _stream_call, dist.barrier), (EXCHANGE, _exchange_call, dist.barrier)]
    rows = []
    for collective in job["collectives"]:
        for count in message_counts(collective, job["sizes"][collective], p):
            nbytes = count * ITEMSIZE
            calls, batches = schedule(nbytes, job["iters"])
            for label, make, barrier in impls:  # ours and the peers alternate, size by size
                if label in REFERENCES + VARIANTS and (collective != "all_reduce"
                                                       or nbytes < STREAM_MIN_BYTES):
                    continue
                buffers = _buffers(collective, count, p)
                call = make(collective, buffers)
                checked, average = label not in REFERENCES, label == AVERAGE
                if checked:
                    _check(collective, buffers, call, rank, p, average)
                if label == LOOP:
                    dist.barrier()
                    times = time_plain_loop(call, calls * batches)
                else:
                    times = common.time_batches(call, barrier, calls, batches)
                if checked:  # still right after the timed calls
                    _check(collective, buffers, call, rank, p, average)
                seconds = common.slowest_median(dist.all_gather_object(times))
                algorithm = {NATIVE: NATIVE_NAMES[collective], STREAM: "read_write_once",
                             EXCHANGE: "copy_in_copy_out"}.get(
                    label) or algorithms.select(collective, transport, nbytes)
                rows.append(dict(collective=collective, world_size=p, backend=label,
                                 bytes=nbytes, seconds=seconds, algorithm=algorithm,
                                 calls_per_batch=calls, batches=batches))
                del buffers, call  # before the next buffers: 256 MiB messages, p ranks
                if rank == 0:
                    busbw = nbytes / seconds * bus_factor(collective, p) / 1e9
                    print(f"{collective} p={p} {common.format_size(nbytes)} "
                          f"{label}: {seconds * 1e6:.1f} us, busbw {busbw:.3g} GB/s", flush=True)
    return {"rows": rows}


# ----- the driver ------------------------------------------------------------------------------
def measure(backends: Sequence[str], world_sizes: Sequence[int], sizes: Dict[str, List[int]],
            iters: int, timeout: float, repeats: int = 1) -> Tuple[List[dict], List[str]]:
    """Rows of every job that ran (each point the median over ``repeats`` runs), and a message
    for every job that failed."""
    job = {"collectives": [c for c in COLLECTIVES if sizes.get(c)], "sizes": sizes,
           "iters": iters}
    plan = [(f"{backend}, {p} ranks, run {run} of {repeats}", backend, p)
            for run in range(1, repeats + 1) for p in world_sizes for backend in backends]
    results, failures = common.run_jobs(SCRIPT, plan, job, timeout)
    return median_over_runs([row for result in results for row in result["rows"]]), failures


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(common.installed_backends()),
                        help="comma-separated; default: %(default)s")
    parser.add_argument("--world-sizes", default="2,4", help="default: %(default)s")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", help="message sizes for every collective, e.g. 4,1K,16M "
                        "(default: 4 B..256 MiB by 4x; all_gather: the gathered output)")
    parser.add_argument("--max-size", default="256M", help="drop sizes above this")
    parser.add_argument("--iters", type=int, default=20,
                        help="timed batches per point (large messages: fewer, at least 5)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every job, interleaved; each point is their median")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--output", action="append", default=[],
                        help="write the results section into this file (repeatable)")
    parser.add_argument("--plot", help="bus bandwidth plot (PNG)")
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.backends = common.parse_backends(args.backends)
    except ValueError as exc:
        parser.error(str(exc))
    try:
        args.world_sizes = [int(p) for p in args.world_sizes.split(",") if p.strip()]
        limit = common.parse_size(args.max_size)
        custom = common.parse_size_list(args.sizes) if args.sizes else None
    except ValueError as exc:
        parser.error(f"--world-sizes, --sizes or --max-size: {exc}")
    if not args.world_sizes or min(args.world_sizes) < 2:
        parser.error(f"--world-sizes must be integers >= 2, got {args.world_sizes}")
    chosen = [c.strip() for c in args.collectives.split(",") if c.strip()]
    if not chosen or any(c not in COLLECTIVES for c in chosen):
        parser.error(f"--collectives must name some of {COLLECTIVES}, got {chosen}")
    if args.iters < 1 or args.repeats < 1:
        parser.error(f"--iters and --repeats must be >= 1, got {args.iters} and {args.repeats}")
    args.size_plan = {c: [s for s in (custom or DEFAULT_SIZES[c]) if s <= limit] for c in chosen}
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    rows, failures = measure(args.backends, args.world_sizes, args.size_plan, args.iters,
                             args.job_timeout, args.repeats)
    common.publish(report(rows, failures, command, machine), args.output, SECTION)
    if args.plot:
        plot(rows, args.plot)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_collectives.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
