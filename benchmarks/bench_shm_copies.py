"""How fast two ranks hand data to each other through the shm workspace, copy by copy.

Two ranks pass a 16 MiB float32 buffer through the workspace in 1 MiB rounds, as the direct
two-rank all-reduce does: copy the round into this rank's input area, barrier, copy the peer's
area out. Each round also copies the same round into an area of the segment that the peer
never reads. Rounds alternate between the workspace's two halves, and the copy into the input
area alternates with them between a plain NumPy copy and streaming (non-temporal) stores
(``backends/numba_stream.py``; skipped without Numba), so each half always gets the same kind.
A rank's time for each copy is its median over all rounds; the reported time the slower
rank's. Each job starts anew (``--repeats``), because where the two cores sit, and with it
whether they share a cache, can change from one job to the next.

    python benchmarks/bench_shm_copies.py [--repeats 20] [--calls 40] [--output FILE]
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

SECTION = "bench_shm_copies"
SCRIPT = os.path.abspath(__file__)
BUFFER_BYTES = 16 << 20
ROUND_BYTES = 1 << 20
COPIES = ("plain into the area the peer reads", "streaming into the area the peer reads",
          "plain into an area nobody else reads", "plain out of the peer's area")
SPELL_FACTOR = 5.0  # a job whose plain copy into the peer's area costs more than this many
# times the copy into the unread area ran while the cores did not share a cache


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    import time

    import numpy as np
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.transports.shm.writer import streaming_copy
    transport = resolve_group(None).transport
    rank, p = dist.get_rank(), dist.get_world_size()
    if p != 2:
        raise RuntimeError(f"bench_shm_copies runs on two ranks, got {p}")
    stream = streaming_copy()
    inputs, results = transport.native_collectives().views(np.dtype(np.float32))
    step = ROUND_BYTES // 4
    buf = np.arange(BUFFER_BYTES // 4, dtype=np.float32) + rank
    received = np.empty_like(buf)
    times: List[List[float]] = [[] for _ in COPIES]
    clock, rounds = time.perf_counter, 0
    dist.barrier()
    for _ in range(job["calls"]):
        for lo in range(0, buf.size, step):
            part, half = buf[lo:lo + step], rounds & 1
            streamed = half == 1 and stream is not None
            start = clock()
            (stream if streamed else np.copyto)(inputs[half][rank][:step], part)
            times[1 if streamed else 0].append(clock() - start)
            dist.barrier()
            start = clock()
            np.copyto(received[lo:lo + step], inputs[half][1 - rank][:step])
            times[3].append(clock() - start)
            start = clock()
            np.copyto(results[rank][:step], part)  # half ``rank`` of the results: nobody reads it
            times[2].append(clock() - start)
            rounds += 1
        dist.barrier()  # the peer has read the last round before the next call rewrites it
    if not np.array_equal(received, np.arange(buf.size, dtype=np.float32) + (1 - rank)):
        raise RuntimeError(f"rank {rank} received wrong data from its peer")
    medians = [common.median(t) if t else None for t in times]
    per_rank = dist.all_gather_object(medians)
    slowest = [None if any(m[i] is None for m in per_rank) else max(m[i] for m in per_rank)
               for i in range(len(COPIES))]
    return {"seconds": slowest}


def report(runs: List[List[Optional[float]]], failures: Sequence[str], command: str,
           machine: str, job: Dict[str, Any]) -> str:
    method = (f"Two ranks pass a {common.format_size(BUFFER_BYTES)} float32 buffer through the "
              f"shm workspace in {common.format_size(ROUND_BYTES)} rounds, {job['calls']} "
              "times per job, one barrier per round; the two halves of the workspace "
              "alternate, and with them the copy into this rank's input area alternates between "
              "plain and streaming stores. us per MiB: each copy's median over the rounds of a "
              "rank, the slower rank's. A job counts as in a spell when its plain copy into the "
              f"area the peer reads costs more than {SPELL_FACTOR:g}x its copy into an area "
              "nobody else reads.")
    lines = common.section_head("Copies between two ranks through the shm workspace "
                                "(`benchmarks/bench_shm_copies.py`)", command, machine, method)
    rows, spells = [], 0
    for index, seconds in enumerate(runs, 1):
        shown = [None if s is None else round(s * 1e6) for s in seconds]
        cells = ["-" if us is None else str(us) for us in shown]
        spell = shown[0] > SPELL_FACTOR * shown[2]  # decided on the numbers shown
        spells += spell
        rows.append([str(index)] + cells + ["yes" if spell else ""])
    lines += [common.markdown_table(["job"] + list(COPIES) + ["spell"], rows), ""]
    lines += [f"Jobs in a spell: {spells} of {len(runs)}.", ""]
    lines += [f"FAILED: {f}" for f in failures]
    return "\n".join(lines).rstrip() + "\n"


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--repeats", type=int, default=20, help="jobs, each started anew")
    parser.add_argument("--calls", type=int, default=40, help="16 MiB passes per job")
    parser.add_argument("--job-timeout", type=float, default=300.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if not args.worker and min(args.repeats, args.calls) < 1:
        parser.error(f"--repeats and --calls must be >= 1, got {args.repeats}, {args.calls}")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"calls": args.calls}
    plan = [(f"shm, 2 ranks, job {run} of {args.repeats}", "shm", 2)
            for run in range(1, args.repeats + 1)]
    results, failures = common.run_jobs(SCRIPT, plan, job, args.job_timeout)
    runs = [result["seconds"] for result in results]
    common.publish(report(runs, failures, command, machine, job), args.output, SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_shm_copies.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
