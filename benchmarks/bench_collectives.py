"""Collective time and bandwidth per backend, with MPI's own collectives measured beside ours.

For each backend (shm, tcp, mpi) and world size, every rank is a real process (our launcher
for shm/tcp, mpiexec for mpi). Each point is timed in batches of calls, each batch right after a
barrier; a rank's time is the median per-call time over batches, the reported time the slowest
rank's. The whole set of jobs runs ``--repeats`` times, interleaved, and each point reports the
median over those runs: on a shared machine a job's speed drifts over minutes, and one run of
ours against one of MPI's would compare moments rather than implementations. Bandwidths follow
nccl-tests: algbw = bytes / time; busbw = algbw * 2(p-1)/p for
all-reduce, * (p-1)/p for all-gather (bytes = the gathered total), * 1 for broadcast. Under
mpiexec, mpi4py's ``Allreduce``/``Allgather``/``Bcast`` run on the same reused buffers.

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

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple  # noqa: E402

COLLECTIVES = ("all_reduce", "all_gather", "broadcast")
DEFAULT_SIZES = {"all_reduce": [4 ** k for k in range(1, 15)],          # 4 B .. 256 MiB
                 "all_gather": [256, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20],
                 "broadcast": [256, 4 << 10, 64 << 10, 1 << 20, 16 << 20, 64 << 20]}
NATIVE = "MPI native"
NATIVE_NAMES = {"all_reduce": "MPI_Allreduce", "all_gather": "MPI_Allgather",
                "broadcast": "MPI_Bcast"}
ITEMSIZE = 4  # float32
BATCH_BYTES = 1 << 20      # small messages run in batches of calls up to about this many bytes
MAX_CALLS_PER_BATCH = 50
REPEAT_BYTES = 1 << 30     # large messages: fewer batches, about this many bytes in all
MIN_BATCHES = 5
SECTION = "bench_collectives"
SCRIPT = os.path.abspath(__file__)


def bus_factor(collective: str, p: int) -> float:
    return {"all_reduce": 2 * (p - 1) / p, "all_gather": (p - 1) / p, "broadcast": 1.0}[collective]


def element_count(collective: str, nbytes: int, p: int) -> int:
    """float32 elements of the message (for all-gather: of the gathered total, a multiple of p)."""
    unit = ITEMSIZE * (p if collective == "all_gather" else 1)
    return max(1, nbytes // unit) * unit // ITEMSIZE


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


def _native_call(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    if collective == "all_reduce":
        return lambda: comm.Allreduce(MPI.IN_PLACE, b["buf"], op=MPI.SUM)
    if collective == "all_gather":
        return lambda: comm.Allgather(b["send"], b["out"])
    return lambda: comm.Bcast(b["buf"], root=0)


def _check(collective: str, b: Dict[str, Any], call: Callable[[], Any], rank: int,
           p: int) -> None:
    """One call on known inputs must give the known result; then every buffer is zeroed, so
    that the timed sums stay finite (and every page is written, not a shared zero page)."""
    import numpy as np
    if collective == "all_reduce":
        b["buf"][...] = rank + 1
        got, expected = b["buf"], np.float32(p * (p + 1) / 2)
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
    from neural_arch.distributed.process_group import resolve_group
    rank, p, backend = dist.get_rank(), dist.get_world_size(), job["backend"]
    transport = resolve_group(None).transport
    impls: List[Tuple[str, Callable, Callable[[], Any]]] = [(backend, _our_call, dist.barrier)]
    if backend == "mpi":
        from mpi4py import MPI
        impls.append((NATIVE, _native_call, MPI.COMM_WORLD.Barrier))
    rows = []
    for collective in job["collectives"]:
        for nbytes in job["sizes"][collective]:
            count = element_count(collective, nbytes, p)
            calls, batches = schedule(count * ITEMSIZE, job["iters"])
            for label, make, barrier in impls:  # ours and MPI's alternate, size by size
                buffers = _buffers(collective, count, p)
                call = make(collective, buffers)
                _check(collective, buffers, call, rank, p)
                times = common.time_batches(call, barrier, calls, batches)
                _check(collective, buffers, call, rank, p)  # still right after the timed calls
                seconds = common.slowest_median(dist.all_gather_object(times))
                algorithm = (NATIVE_NAMES[collective] if label == NATIVE
                             else algorithms.select(collective, transport, count * ITEMSIZE))
                rows.append(dict(collective=collective, world_size=p, backend=label,
                                 bytes=count * ITEMSIZE, seconds=seconds, algorithm=algorithm,
                                 calls_per_batch=calls, batches=batches))
                if rank == 0:
                    busbw = count * ITEMSIZE / seconds * bus_factor(collective, p) / 1e9
                    print(f"{collective} p={p} {common.format_size(count * ITEMSIZE)} "
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


def median_over_runs(rows: Sequence[dict]) -> List[dict]:
    """One row per (collective, world size, backend, bytes): the median time of its runs."""
    runs: Dict[tuple, List[dict]] = {}
    for row in rows:
        key = (row["collective"], row["world_size"], row["backend"], row["bytes"])
        runs.setdefault(key, []).append(row)
    return [dict(found[0], seconds=common.median([r["seconds"] for r in found]),
                 runs=len(found)) for found in runs.values()]


def _lookup(rows: Sequence[dict], collective: str, p: int, backend: str,
            nbytes: int) -> Optional[dict]:
    for row in rows:
        if (row["collective"], row["world_size"], row["backend"], row["bytes"]) == \
                (collective, p, backend, nbytes):
            return row
    return None


def bandwidths(row: dict) -> Tuple[float, float]:
    """(algbw, busbw) in GB/s (10^9 bytes per second)."""
    algbw = row["bytes"] / row["seconds"] / 1e9
    return algbw, algbw * bus_factor(row["collective"], row["world_size"])


def speed_vs_native(rows: Sequence[dict], row: dict) -> Optional[float]:
    """How many times faster than MPI native on the same collective, size and world size."""
    native = _lookup(rows, row["collective"], row["world_size"], NATIVE, row["bytes"])
    return None if native is None else native["seconds"] / row["seconds"]


def tables(rows: Sequence[dict]) -> str:
    order = {name: i for i, name in enumerate(("shm", "tcp", "mpi", NATIVE))}
    parts = []
    for collective in COLLECTIVES:
        for p in sorted({r["world_size"] for r in rows if r["collective"] == collective}):
            chosen = sorted((r for r in rows if (r["collective"], r["world_size"]) ==
                             (collective, p)), key=lambda r: (r["bytes"],
                                                              order.get(r["backend"], 9)))
            body = []
            for row in chosen:
                algbw, busbw = bandwidths(row)
                ratio = speed_vs_native(rows, row)
                body.append([common.format_size(row["bytes"]), row["backend"], row["algorithm"],
                             f"{row['seconds'] * 1e6:.1f}", f"{algbw:.3g}", f"{busbw:.3g}",
                             "" if ratio is None or row["backend"] == NATIVE
                             else f"{ratio:.2f}x"])
            parts.append(f"### {collective}, p = {p}\n\n" + common.markdown_table(
                ["size", "backend", "algorithm", "time (us)", "algbw (GB/s)", "busbw (GB/s)",
                 "speed vs MPI native"], body, "lllrrrr"))
    return "\n\n".join(parts)


def goals(rows: Sequence[dict]) -> List[Tuple[str, str, Optional[bool]]]:
    """(goal, measured, met) for each goal; met is None when it was not measured."""
    out = []
    mib = 1 << 20
    for p, factor in ((2, 2.0), (4, 1.0)):
        for size in (16 * mib, 64 * mib):
            ours = _lookup(rows, "all_reduce", p, "shm", size)
            native = _lookup(rows, "all_reduce", p, NATIVE, size)
            goal = (f"shm all_reduce busbw >= {factor:g}x MPI native at "
                    f"{common.format_size(size)}, p={p}")
            if ours is None or native is None:
                out.append((goal, "-", None))
                continue
            mine, theirs = bandwidths(ours)[1], bandwidths(native)[1]
            out.append((goal, f"{mine:.3g} vs {theirs:.3g} GB/s ({mine / theirs:.2f}x)",
                        mine >= factor * theirs))
    tiny = _lookup(rows, "all_reduce", 2, "shm", 4)
    out.append(("shm 4-byte all_reduce <= 8 us, p=2",
                "-" if tiny is None else f"{tiny['seconds'] * 1e6:.2f} us",
                None if tiny is None else tiny["seconds"] <= 8e-6))
    tcp = _lookup(rows, "all_reduce", 2, "tcp", 64 * mib)
    out.append(("tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2",
                "-" if tcp is None else f"{bandwidths(tcp)[1]:.3g} GB/s",
                None if tcp is None else bandwidths(tcp)[1] >= 1.5))
    return out


def goals_table(rows: Sequence[dict]) -> str:
    return common.markdown_table(["goal", "measured", "result"],
                                 [[g, m, common.verdict(ok)] for g, m, ok in goals(rows)], "llr")


def plot(rows: Sequence[dict], path: str) -> None:
    plt = common.pyplot()
    reduce_rows = [r for r in rows if r["collective"] == "all_reduce"]
    sizes = sorted({r["world_size"] for r in reduce_rows})
    if not sizes:
        return
    fig, axes = plt.subplots(1, len(sizes), figsize=(6 * len(sizes), 4.5), squeeze=False)
    for ax, p in zip(axes[0], sizes):
        for backend in ("shm", "tcp", "mpi", NATIVE):
            points = sorted((r["bytes"], bandwidths(r)[1]) for r in reduce_rows
                            if r["world_size"] == p and r["backend"] == backend)
            if points:
                ax.plot(*zip(*points), marker="o", label=backend,
                        linestyle="--" if backend == NATIVE else "-")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(f"all_reduce float32 SUM, p = {p}")
        ax.set_xlabel("message size (bytes)")
        ax.set_ylabel("bus bandwidth (GB/s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.tight_layout()
    common.save_figure(fig, path)


def report(rows: Sequence[dict], failures: Sequence[str], command: str, machine: str) -> str:
    lines = common.section_head(
        "Collectives by backend (`benchmarks/bench_collectives.py`)", command, machine,
        "float32 buffers reused by every call. Time: median per-call time over batches of "
        "calls, each batch started right after a barrier; the slowest rank's median; the "
        "median of that over the runs of the job (--repeats, interleaved with the other jobs). "
        "algbw = bytes / time; busbw = algbw x 2(p-1)/p (all_reduce), x (p-1)/p "
        "(all_gather, bytes = gathered total), x 1 (broadcast). Speed vs MPI native = MPI "
        "time / our time (> 1: ours is faster). GB/s = 10^9 B/s.")
    lines += ["### Goals", "", goals_table(rows), ""]
    lines += [f"Failed job: {f}" for f in failures]
    lines += ["", tables(rows)]
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default=",".join(common.installed_backends()),
                        help="comma-separated; default: %(default)s")
    parser.add_argument("--world-sizes", default="2,4", help="default: %(default)s")
    parser.add_argument("--collectives", default=",".join(COLLECTIVES))
    parser.add_argument("--sizes", help="message sizes for every collective, e.g. 4,1K,16M "
                        "(default: 4 B..256 MiB by 4x for all_reduce, 256 B..64 MiB for the others)")
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


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.worker:
        common.worker_main(args.worker, worker)
        return 0
    machine = common.machine_info()
    rows, failures = measure(args.backends, args.world_sizes, args.size_plan, args.iters,
                             args.job_timeout, args.repeats)
    command = common.command_line("benchmarks/bench_collectives.py",
                                  sys.argv[1:] if argv is None else argv)
    common.publish(report(rows, failures, command, machine), args.output, SECTION)
    if args.plot:
        plot(rows, args.plot)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
