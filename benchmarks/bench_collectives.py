"""Collective time and bandwidth per backend, with MPI's own collectives measured beside ours.

For each backend (shm, tcp, mpi) and world size, every rank is a real process (our launcher
for shm/tcp, mpiexec for mpi). Each point is timed in batches of calls, each batch right after a
barrier; a rank's time is the median per-call time over batches, the reported time the slowest
rank's. Up to ``TURNS_MAX_BYTES`` the rows of a size (ours, MPI's, AVERAGE, the plain loop, the
references) are timed in turns, a batch of each per round (``timed_rows``). The whole set of
jobs runs ``--repeats`` times, interleaved, and each point reports the median over those runs:
on a shared machine a job's speed drifts over minutes, and one run of ours against one of
MPI's would compare moments rather than implementations. Every collective
runs 4 B to 256 MiB by 4x unless ``--sizes`` says otherwise. Sizes and bandwidths follow
nccl-tests: an all-gather's or gather's size is its gathered output (each rank sends size / p),
a reduce-scatter's or scatter's its input (each rank receives size / p); algbw = bytes / time;
busbw = algbw * 2(p-1)/p for all-reduce, * (p-1)/p for all-gather, reduce-scatter, gather and
scatter, * 1 for broadcast and reduce. The reduce-scatter (``dist.reduce_scatter_tensor``, SUM)
and the rooted reduce (SUM), gather and scatter (root: rank 0; the root's lists p reused arrays)
are timed only when ``--collectives`` names them; the rooted ones' algorithm column names what
runs (``rooted_algorithm``). Under mpiexec, mpi4py's ``Allreduce``/``Allgather``/
``Reduce_scatter_block``/``Bcast``/``Reduce`` (in place on the root)/``Gather``/``Scatter`` run
on the same reused buffers. In the shm jobs a ``buffer stream`` row bounds all-reduces from
1 MiB: every rank reads and writes its own buffer once through a cache-sized scratch, all at
once, which no all-reduce that leaves its result in the caller's buffer can beat on the same
machine; and a ``copy exchange`` row times the copies the direct all-reduce makes at p = 2
without its sums: every rank copies its buffer into its area of the shared workspace and its
neighbour's copy back, a round at a time, so it shows how fast data moves between the cores in
that job. Two more shm rows at every all-reduce size show what users see: ``shm AVERAGE`` (the
op DDP uses) and ``shm plain loop`` (calls timed one by one in a plain loop, no barrier between
them; in the turns a round of at least ``LOOP_TURN_CALLS`` of them after a barrier). The
``barrier`` (no message) is timed like the collectives: ``dist.barrier`` in every
job, ``MPI_Barrier`` beside it under mpiexec. Every broadcast, all-gather and reduce-scatter
is timed again, ours and MPI's alike, with its inputs written inside each timed call
(``<backend> fresh data`` rows, ``fresh_calls``; ``--no-fresh`` leaves them out): the
broadcast's root fills its buffer with the call's index, in an all-gather or reduce-scatter
every rank fills its input with a value of the call's index and its rank. With unchanged
inputs, as osu_bcast, osu_allgather and nccl-tests time them, a single-copy MPI call reads lines
that stay in the peer's cache, which a training step's freshly computed data would not be:
MPI_Allgather of 256 KiB at p = 2 took 12-13 us on an unchanged input and 56-60 us on one
written before every call, ours 49-57 either way (``mpiexec -n 2 python
benchmarks/mpi_fresh_inputs.py``). The goal lines are printed again at the end of the run.

    python benchmarks/bench_collectives.py [--backends shm,tcp,mpi] [--world-sizes 2,4]
        [--collectives all_reduce,all_gather,broadcast,barrier,reduce_scatter,reduce,gather,
                       scatter]
        [--no-fresh] [--sizes 4,1K,16M] [--max-size 256M] [--iters 20] [--repeats 3]
        [--output benchmarks/RESULTS.md]
        [--plot docs/collectives_bandwidth.png] [--latency-plot docs/collectives_latency.png]

The goals at every size alone (p = 2 and 4, up to 4 MiB):

    python benchmarks/bench_collectives.py --backends shm,mpi --world-sizes 2,4
        --collectives all_reduce,broadcast,barrier --max-size 4M --output FILE
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
import collective_calls as rank_calls  # noqa: E402
import fresh_calls  # noqa: E402
from timed_rows import TimedRow, in_turns  # noqa: E402
from collective_calls import ITEMSIZE, time_plain_loop  # noqa: E402,F401
# the report's names are also used as bench_collectives.<name> by other scripts and tests
from collectives_report import (AVERAGE, BARRIER, COLLECTIVES, EXCHANGE, FRESH,  # noqa: E402,F401
                                LOOP, NATIVE, REFERENCES, STREAM, TURNS_MAX_BYTES,
                                bandwidths, bus_factor,
                                earlier_goals, fresh, goals, median_over_runs, plot, report,
                                size_goals, tables)
from collectives_goals import summary  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: E402

# 4 B .. 256 MiB by 4x for every collective; an all-gather's size is its gathered output, as in
# nccl-tests (each rank sends size / p), so 256 MiB is 256 MiB out and 256 / p MiB in per rank;
# a reduce-scatter's is its input (256 MiB in, 256 / p MiB out per rank); a gather's and a
# scatter's likewise (the root's whole output or input)
DEFAULT_SIZES = {c: [4 ** k for k in range(1, 15)] for c in COLLECTIVES}
CHOICES = COLLECTIVES + (BARRIER,)  # --collectives; a barrier is timed without a message
DEFAULT_COLLECTIVES = ("all_reduce", "all_gather", "broadcast", BARRIER)
# a message of p equal blocks
SPLIT_OVER_RANKS = ("all_gather", "reduce_scatter", "gather", "scatter")
ROOTED = ("reduce", "gather", "scatter")  # no algorithms.select entry: see rooted_algorithm
NATIVE_NAMES = {"all_reduce": "MPI_Allreduce", "all_gather": "MPI_Allgather",
                "reduce_scatter": "MPI_Reduce_scatter_block", "broadcast": "MPI_Bcast",
                "reduce": "MPI_Reduce", "gather": "MPI_Gather", "scatter": "MPI_Scatter",
                BARRIER: "MPI_Barrier"}
BATCH_BYTES = 1 << 20      # small messages run in batches of calls up to about this many bytes
MAX_CALLS_PER_BATCH = 50
REPEAT_BYTES = 1 << 30     # large messages: fewer batches, about this many bytes in all
MIN_BATCHES = 5
STREAM_MIN_BYTES = 1 << 20  # the buffer stream and copy exchange: all-reduces this large
VARIANTS = (AVERAGE, LOOP)   # our all-reduce as users call it, beside the batched SUM
VARIANTS_FROM_BYTES = 4      # this script times them at every size (the AVERAGE goals)
SECTION = "bench_collectives"
SCRIPT = os.path.abspath(__file__)


def element_count(collective: str, nbytes: int, p: int) -> int:
    """float32 elements of the message (for all-gather and gather: of the gathered total, for
    reduce-scatter and scatter: of the input, each a multiple of p; for a barrier: none)."""
    if collective == BARRIER:
        return 0
    unit = ITEMSIZE * (p if collective in SPLIT_OVER_RANKS else 1)
    return max(1, nbytes // unit) * unit // ITEMSIZE


def message_counts(collective: str, sizes: Sequence[int], p: int) -> List[int]:
    """The distinct element counts of ``sizes`` (tiny messages split over the ranks round up
    to one float32 per rank, so e.g. 4 B and 16 B are the same 16-byte message at p = 4:
    timed once)."""
    return sorted({element_count(collective, nbytes, p) for nbytes in sizes})


def rooted_algorithm(collective: str, p: int, nbytes: int) -> str:
    """What runs a reduce, gather or scatter of ``nbytes`` (the table's size) at ``p`` ranks:
    ``pair`` (one exchange with the root check) at two ranks while each rank's part (a
    reduce's whole buffer, a gather's or scatter's block) takes it (``algorithms.pair``),
    else the binomial ``tree``, on every transport."""
    if collective not in ROOTED:
        raise ValueError(f"rooted_algorithm takes one of {ROOTED}, got {collective!r}")
    try:
        from neural_arch.distributed.algorithms import pair
    except ImportError:  # a tree of the package older than the pair form, timed for comparison
        return "tree"
    part = nbytes if collective == "reduce" else nbytes // p
    return "pair" if pair.applies(p, part) else "tree"


def schedule(nbytes: int, iters: int) -> Tuple[int, int]:
    """(calls per batch, timed batches) for a message of ``nbytes`` (a barrier's 0: as 1)."""
    nbytes = max(1, nbytes)
    calls = max(1, min(MAX_CALLS_PER_BATCH, BATCH_BYTES // nbytes))
    batches = max(min(MIN_BATCHES, iters), min(iters, REPEAT_BYTES // (nbytes * calls)))
    return calls, batches


# ----- one rank of a job ---------------------------------------------------------------------
def _times_point(label: str, collective: str, nbytes: int, variants_from: int) -> bool:
    """Whether ``label``'s row is measured at this point: the references only for all-reduces
    from STREAM_MIN_BYTES, the AVERAGE and plain-loop variants for all-reduces from
    ``variants_from``, the fresh-data rows for the collectives ``fresh_calls`` rewrites."""
    if label in REFERENCES:
        return collective == "all_reduce" and nbytes >= STREAM_MIN_BYTES
    if label in VARIANTS:
        return collective == "all_reduce" and nbytes >= variants_from
    if label.endswith(FRESH):
        return collective in fresh_calls.FRESH_COLLECTIVES
    return True


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.group.world import resolve_group
    rank, p, backend = dist.get_rank(), dist.get_world_size(), job["backend"]
    transport = resolve_group(None).transport
    impls: List[Tuple[str, Callable, Callable[[], Any]]] = [
        (backend, rank_calls.our_call, dist.barrier)]
    if backend == "mpi":
        from mpi4py import MPI
        impls.append((NATIVE, rank_calls.native_call, MPI.COMM_WORLD.Barrier))
    if backend == "shm":
        impls += [(AVERAGE, rank_calls.average_call, dist.barrier),
                  (LOOP, rank_calls.our_call, None),
                  (STREAM, rank_calls.stream_call, dist.barrier),
                  (EXCHANGE, rank_calls.exchange_call, dist.barrier)]
    if job.get("fresh") and set(job["collectives"]) & set(fresh_calls.FRESH_COLLECTIVES):
        impls += [(fresh(label), fresh_calls.rewriting(make, rank, p), barrier)
                  for label, make, barrier in impls if label in (backend, NATIVE)]
    variants_from = job.get("variants_from", STREAM_MIN_BYTES)
    rows = []
    for collective in job["collectives"]:
        for count in message_counts(collective, job["sizes"][collective], p):
            nbytes = count * ITEMSIZE
            calls, batches = schedule(nbytes, job["iters"])
            todo = [impl for impl in impls if _times_point(impl[0], collective, nbytes,
                                                            variants_from)]
            # ours and the peers alternate, size by size; up to TURNS_MAX_BYTES batch by batch
            # in turns, larger sizes one row after another (one row's buffers at a time)
            groups = [todo] if nbytes <= TURNS_MAX_BYTES else [[impl] for impl in todo]
            for group in groups:
                timed = [TimedRow(collective, label, make, barrier, count, rank, p)
                         for label, make, barrier in group]
                times = (in_turns(timed, calls, batches) if nbytes <= TURNS_MAX_BYTES
                         else [timed[0].alone(calls, batches)])
                for row in times:
                    row_timed = timed.pop(0)  # the list lets go of its buffers
                    row_timed.check_after()
                    label = row_timed.label
                    del row_timed
                    seconds = common.slowest_median(dist.all_gather_object(row))
                    native = NATIVE_NAMES[collective]
                    algorithm = {NATIVE: native, fresh(NATIVE): native,
                                 STREAM: "read_write_once",
                                 EXCHANGE: "copy_in_copy_out"}.get(label) or (
                        rooted_algorithm(collective, p, nbytes) if collective in ROOTED
                        else algorithms.select(collective, transport, nbytes))
                    rows.append(dict(collective=collective, world_size=p, backend=label,
                                     bytes=nbytes, seconds=seconds, algorithm=algorithm,
                                     calls_per_batch=calls, batches=batches))
                    if rank == 0:
                        _print_point(collective, p, label, nbytes, seconds)
    return {"rows": rows}


def _print_point(collective: str, p: int, label: str, nbytes: int, seconds: float) -> None:
    point = f"{collective} p={p}" + ("" if collective == BARRIER
                                     else f" {common.format_size(nbytes)}")
    bandwidth = "" if collective == BARRIER else \
        f", busbw {nbytes / seconds * bus_factor(collective, p) / 1e9:.3g} GB/s"
    print(f"{point} {label}: {seconds * 1e6:.1f} us{bandwidth}", flush=True)


# ----- the driver ------------------------------------------------------------------------------
def measure(backends: Sequence[str], world_sizes: Sequence[int], sizes: Dict[str, List[int]],
            iters: int, timeout: float, repeats: int = 1, variants_from: int = STREAM_MIN_BYTES,
            fresh: bool = False) -> Tuple[List[dict], List[str]]:
    """Rows of every job that ran (each point the median over ``repeats`` runs), and a message
    for every job that failed. ``sizes`` maps each collective to its message sizes (a
    barrier's: ``[0]``); the shm AVERAGE and plain-loop rows are timed from ``variants_from``
    bytes; with ``fresh``, every broadcast, all-gather and reduce-scatter again with its
    inputs rewritten before each call (``fresh(backend)`` rows, MPI's too)."""
    job = {"collectives": [c for c in CHOICES if sizes.get(c)], "sizes": sizes,
           "iters": iters, "variants_from": variants_from, "fresh": fresh}
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
    parser.add_argument("--collectives", default=",".join(DEFAULT_COLLECTIVES),
                        help=f"comma-separated, of {','.join(CHOICES)}; default: %(default)s")
    parser.add_argument("--sizes", help="message sizes for every collective, e.g. 4,1K,16M "
                        "(default: 4 B..256 MiB by 4x; all_gather, gather: the gathered "
                        "output; reduce_scatter, scatter: the input)")
    parser.add_argument("--max-size", default="256M", help="drop sizes above this")
    parser.add_argument("--iters", type=int, default=20,
                        help="timed batches per point (large messages: fewer, at least 5)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="runs of every job, interleaved; each point is their median")
    parser.add_argument("--fresh", "--fresh-broadcast", action=argparse.BooleanOptionalAction,
                        default=True, help="time every broadcast, all_gather and "
                        "reduce_scatter again with its inputs rewritten before each call, "
                        "MPI's too (default: on)")
    parser.add_argument("--job-timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--output", action="append", default=[],
                        help="write the results section into this file (repeatable)")
    parser.add_argument("--plot", help="bus bandwidth plot (PNG)")
    parser.add_argument("--latency-plot", help="time per call plot (PNG)")
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
    if not chosen or any(c not in CHOICES for c in chosen):
        parser.error(f"--collectives must name some of {CHOICES}, got {chosen}")
    if args.iters < 1 or args.repeats < 1:
        parser.error(f"--iters and --repeats must be >= 1, got {args.iters} and {args.repeats}")
    args.size_plan = {c: [0] if c == BARRIER else
                      [s for s in (custom or DEFAULT_SIZES[c]) if s <= limit] for c in chosen}
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    rows, failures = measure(args.backends, args.world_sizes, args.size_plan, args.iters,
                             args.job_timeout, args.repeats, VARIANTS_FROM_BYTES,
                             args.fresh)
    common.publish(report(rows, failures, command, machine), args.output, SECTION)
    if args.plot:
        plot(rows, args.plot)
    if args.latency_plot:
        plot(rows, args.latency_plot, metric="latency")
    print("\nGoals:\n" + summary(rows), flush=True)  # last, where a terminal shows them
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_collectives.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
