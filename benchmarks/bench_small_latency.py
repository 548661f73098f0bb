"""Where the time of a small all-reduce, broadcast and all-gather goes, layer by layer, on the
shm backend.

Eleven rows, all timed in the same job on the same buffer: the bare barrier on the shared
arrival counters; the direct shared-memory all-reduce called as an algorithm (one barrier
plus its copies and checks); the public ``dist.all_reduce`` on its short path (a NumPy array,
the default group, synchronous); and the public call forced onto its general path
(``algorithm="auto"``), which every other kind of call takes. The last two each add their
layer to the algorithm row. The broadcast from rank 0 gets the same three rows: the
shared-memory broadcast as an algorithm, ``dist.broadcast`` on its short path, and on its
general path (forced with ``algorithm="auto"``); and so does the all-gather
(``dist.all_gather_into_tensor``, each rank sending the message size). The last row is
``dist.barrier``, beside the bare barrier of the first. Each layer is timed in
batches of calls, each batch right after a barrier, the layers taking turns batch by batch (a
slow spell of a shared machine then falls on all of them alike); a rank's time is its median
per-call time, the reported time the slowest rank's, and the whole job runs ``--repeats``
times (median of those).

    python benchmarks/bench_small_latency.py [--world-sizes 2,4] [--bytes 4] [--calls 200]
        [--batches 50] [--repeats 5] [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence  # noqa: E402

SECTION = "bench_small_latency"
SCRIPT = os.path.abspath(__file__)
LAYERS = ("barrier on the arrival counters", "shm_direct all-reduce (algorithm only)",
          "dist.all_reduce, short path", "dist.all_reduce, general path",
          "shm_direct broadcast (algorithm only)", "dist.broadcast, short path",
          "dist.broadcast, general path", "shm_direct all-gather (algorithm only)",
          "dist.all_gather_into_tensor, short path", "dist.all_gather_into_tensor, general path",
          "dist.barrier")
BUILDS_ON = (None, 0, 1, 1, 0, 4, 4, 0, 7, 7, 0)  # the row whose time each layer adds to
GOAL_US = 8.0  # the 4-byte shm all-reduce at p=2


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    import numpy as np
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports.base import Fingerprint
    rank, p = dist.get_rank(), dist.get_world_size()
    transport = resolve_group(None).transport
    direct = transport.native_collectives()  # shared memory's own collectives
    x = np.zeros(max(1, job["bytes"] // 4), np.float32)
    for _ in range(job["calls"]):  # warm-up: caches of views and plans are filled
        dist.all_reduce(x)
    fp = Fingerprint("bench_all_reduce", 0, "float32", x.size, 0)
    seq = [0]

    def bare_barrier():
        g = transport.generation
        gen = g.gen + 1
        g.arrive(gen)
        g.wait(gen, "bench_barrier", None)

    def algorithm_only():
        seq[0] += 1
        direct.all_reduce(x, ReduceOp.SUM, fp._replace(seq=seq[0]))

    bcast_fp = Fingerprint("bench_broadcast", 0, "float32", x.size, 0)

    def broadcast_algorithm_only():
        seq[0] += 1
        direct.broadcast(x, 0, bcast_fp._replace(seq=seq[0]))

    gathered = np.zeros(p * x.size, np.float32)
    gather_fp = Fingerprint("bench_all_gather", 0, "float32", x.size, 0)

    def all_gather_algorithm_only():
        seq[0] += 1
        direct.all_gather(x, gathered, gather_fp._replace(seq=seq[0]))

    calls = [bare_barrier, algorithm_only, lambda: dist.all_reduce(x),
             lambda: dist.all_reduce(x, algorithm="auto"), broadcast_algorithm_only,
             lambda: dist.broadcast(x, 0), lambda: dist.broadcast(x, 0, algorithm="auto"),
             all_gather_algorithm_only, lambda: dist.all_gather_into_tensor(gathered, x),
             lambda: dist.all_gather_into_tensor(gathered, x, algorithm="auto"), dist.barrier]
    times: List[List[float]] = [[] for _ in calls]
    for _ in range(job["batches"]):
        for call, batch_times in zip(calls, times):
            batch_times += common.time_batches(call, dist.barrier, job["calls"], 1,
                                               warmup_batches=0)
    seconds = [common.slowest_median(dist.all_gather_object(t)) for t in times]
    x[...] = rank + 1
    dist.all_reduce(x)
    if not np.all(x == p * (p + 1) / 2):
        raise RuntimeError(f"all_reduce on rank {rank} of {p} gave {x[:4]}")
    x[...] = rank + 1
    dist.broadcast(x, 0)
    if not np.all(x == 1):
        raise RuntimeError(f"broadcast from rank 0 on rank {rank} of {p} gave {x[:4]}")
    x[...] = rank + 1
    dist.all_gather_into_tensor(gathered, x)
    if not np.array_equal(gathered, np.repeat(np.arange(1, p + 1, dtype=np.float32), x.size)):
        raise RuntimeError(f"all_gather on rank {rank} of {p} gave {gathered[:8]}")
    return {"world_size": p, "seconds": seconds}


def report(runs: Dict[int, List[List[float]]], failures: Sequence[str], command: str,
           machine: str, job: Dict[str, Any]) -> str:
    method = (f"float32 all-reduce (SUM), broadcast (from rank 0) and all-gather (each rank "
              f"sending) of {common.format_size(job['bytes'])} on the shm backend. "
              f"Time per call: median over {job['batches']} batches of {job['calls']} calls, "
              "each batch started after a barrier, the layers taking turns batch by batch; "
              "the slowest rank's median; the median over "
              "the runs of the job (--repeats). Added: over the barrier row (the algorithms) "
              "or the collective's algorithm row (its two public paths).")
    lines = common.section_head("Small all-reduce, broadcast and all-gather, layer by layer "
                                "(`benchmarks/bench_small_latency.py`)",
                                command, machine, method)
    goal = None
    for p, per_run in sorted(runs.items()):
        medians = [common.median([run[i] for run in per_run]) for i in range(len(LAYERS))]
        rows = []
        for layer, seconds, below in zip(LAYERS, medians, BUILDS_ON):
            added = seconds - (medians[below] if below is not None else 0.0)
            rows.append([layer, f"{seconds * 1e6:.2f}", f"{added * 1e6:+.2f}"])
        if p == 2 and job["bytes"] == 4:
            goal = medians[2] * 1e6
        lines += [f"### p = {p} ({len(per_run)} runs)", "",
                  common.markdown_table(["layer", "time (us)", "added (us)"], rows), ""]
    if goal is not None:
        lines += ["### Goal", "", common.markdown_table(
            ["goal", "measured", "result"],
            [[f"shm 4-byte all_reduce <= {GOAL_US:g} us, p=2", f"{goal:.2f} us",
              common.verdict(goal <= GOAL_US)]], align="llr"), ""]
    lines += [f"FAILED: {f}" for f in failures]
    return "\n".join(lines).rstrip() + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--world-sizes", default="2,4")
    parser.add_argument("--bytes", default="4", help="message size, e.g. 4, 1K")
    parser.add_argument("--calls", type=int, default=200, help="calls per batch")
    parser.add_argument("--batches", type=int, default=50, help="timed batches per layer")
    parser.add_argument("--repeats", type=int, default=5, help="runs of each job")
    parser.add_argument("--job-timeout", type=float, default=600.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.world_sizes = [int(p) for p in args.world_sizes.split(",")]
        args.bytes = common.parse_size(args.bytes)
    except ValueError:
        parser.error(f"cannot read --world-sizes {args.world_sizes!r} or --bytes {args.bytes!r}")
    if min(args.world_sizes) < 2 or min(args.calls, args.batches, args.repeats, args.bytes) < 1:
        parser.error("--world-sizes must be >= 2; --calls, --batches, --repeats, --bytes >= 1")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"bytes": args.bytes, "calls": args.calls, "batches": args.batches}
    plan = [(f"shm, {p} ranks, run {run} of {args.repeats}", "shm", p)
            for run in range(1, args.repeats + 1) for p in args.world_sizes]
    results, failures = common.run_jobs(SCRIPT, plan, job, args.job_timeout)
    runs: Dict[int, List[List[float]]] = {}
    for result in results:
        runs.setdefault(result["world_size"], []).append(result["seconds"])
    common.publish(report(runs, failures, command, machine, job), args.output, SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_small_latency.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
