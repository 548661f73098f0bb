"""Data-parallel training speed: all-reduce bandwidth, step time, weak scaling, overlap gain.

Every rank trains the same MLP (DistributedDataParallel, SGD) on its own fixed batch of
``--batch`` samples, with one BLAS thread per rank. A step is forward, cross-entropy, backward,
``sync_gradients()`` and the optimizer step, started right after a barrier; the reported step
time is the slowest rank's median. Weak-scaling efficiency is t(1) / t(p) with the per-rank
batch fixed (t(1): one process, nothing to communicate). The communication share is the time
spent in ``sync_gradients()`` over the step; with ``auto_sync=True`` most communication runs
during backward, so this is only the part left exposed. The all-reduce table comes from
``bench_collectives.py`` (MPI's own ``Allreduce`` beside ours).

    python benchmarks/distributed_training_benchmark.py [--quick] [--backends shm,tcp,mpi]
        [--output benchmarks/RESULTS.md] [--plot docs/scaling.png]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
from bench_common import model_name, parameter_count  # noqa: E402
# the report's names are also used as distributed_training_benchmark.<name> by tests
from training_report import (GOAL_EFFICIENCY, GOAL_MODEL, MODES, efficiency,  # noqa: E402,F401
                             goals, plot, report, training_table)

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence, Tuple  # noqa: E402

import bench_collectives  # noqa: E402

MODELS = {"1M": [784, 1024, 256, 10], "goal": GOAL_MODEL,
          "10M": [784, 2048, 2048, 2048, 10], "50M": [784, 4096, 4096, 4096, 4096, 10]}
QUICK_MODELS = ("1M", "goal")
BIG_MODEL_PARAMS = 20_000_000   # models above this run a third of the steps
ALLREDUCE_SIZES = ["4", "64K", "1M", "16M", "64M"]
QUICK_ALLREDUCE_SIZES = ["4", "1M", "16M"]
SECTION = "distributed_training_benchmark"
SCRIPT = os.path.abspath(__file__)


def steps_for(sizes: Sequence[int], steps: int) -> int:
    return max(min(3, steps), steps // 3) if parameter_count(sizes) > BIG_MODEL_PARAMS else steps


# ----- one rank of a job ---------------------------------------------------------------------
def _replica_digest(model) -> str:
    import hashlib
    digest = hashlib.sha256()
    for _, p in model.named_parameters():
        digest.update(p.array.tobytes())
    return digest.hexdigest()


def _train(sizes: List[int], mode: str, batch: int, steps: int, warmup: int) -> Dict[str, Any]:
    import time

    import numpy as np

    import neural_arch.functional as F
    from neural_arch import distributed as dist
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    rank = dist.get_rank()
    manual_seed(rank)  # replicas start different: DDP must copy rank 0's weights
    model = dist.DistributedDataParallel(MLP(sizes), auto_sync=mode == "auto")
    optimizer = SGD(model.parameters(), lr=0.01)
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch).astype(np.int64)
    step_times, sync_times = [], []
    for i in range(warmup + steps):
        dist.barrier()
        start = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        before_sync = time.perf_counter()
        model.sync_gradients()
        after_sync = time.perf_counter()
        optimizer.step()
        end = time.perf_counter()
        if i >= warmup:
            step_times.append(end - start)
            sync_times.append(after_sync - before_sync)
    digests = dist.all_gather_object(_replica_digest(model.module))
    if len(set(digests)) != 1:
        differing = [r for r, d in enumerate(digests) if d != digests[0]]
        raise RuntimeError(f"replicas of {model_name(sizes)} ({mode} sync) differ after "
                           f"{warmup + steps} steps: ranks {differing} disagree with rank 0")
    everyone = dist.all_gather_object((step_times, sync_times))
    return dict(step=common.slowest_median([s for s, _ in everyone]),
                sync=common.slowest_median([c for _, c in everyone]))


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    p, rows = dist.get_world_size(), []
    for sizes in job["models"]:
        for mode in (MODES if p > 1 else ("manual",)):
            steps = steps_for(sizes, job["steps"])
            timing = _train(sizes, mode, job["batch"], steps, job["warmup"])
            rows.append(dict(model=model_name(sizes), params=parameter_count(sizes),
                             world_size=p, backend=job["backend"] if p > 1 else "-", mode=mode,
                             batch=job["batch"], steps=steps, **timing))
            if dist.get_rank() == 0:
                print(f"{model_name(sizes)} p={p} {mode}: step {timing['step'] * 1e3:.1f} ms, "
                      f"sync {timing['sync'] * 1e3:.1f} ms", flush=True)
    return {"rows": rows}


# ----- the driver ------------------------------------------------------------------------------
def measure_training(backends: Sequence[str], world_sizes: Sequence[int],
                     models: Sequence[List[int]], batch: int, steps: int, warmup: int,
                     timeout: float) -> Tuple[List[dict], List[str]]:
    job = {"models": [list(m) for m in models], "batch": batch, "steps": steps,
           "warmup": warmup}
    plan = [(f"training, {b}, {p} ranks", b, p) for p in world_sizes if p > 1 for b in backends]
    if 1 in world_sizes:  # one process: no communication, the same on every backend
        plan.insert(0, ("training, one process", next((b for b in backends if b != "mpi"),
                                                      "shm"), 1))
    results, failures = common.run_jobs(SCRIPT, plan, job, timeout)
    return [row for result in results for row in result["rows"]], failures


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help=f"models {', '.join(QUICK_MODELS)}, world sizes 1,2, fewer steps")
    parser.add_argument("--backends", default=",".join(common.installed_backends()))
    parser.add_argument("--world-sizes", help="default 1,2,4 (quick: 1,2)")
    parser.add_argument("--models", help=f"preset names ({', '.join(MODELS)}) or layer sizes "
                        "like 784-1024-10, comma-separated (default: all presets)")
    parser.add_argument("--batch", type=int, default=256, help="samples per rank")
    parser.add_argument("--steps", type=int, help="timed steps (default 10, quick 4)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--allreduce-sizes", help="comma-separated; 'none' skips the sweep")
    parser.add_argument("--iters", type=int, default=10, help="all-reduce timed batches")
    parser.add_argument("--job-timeout", type=float, default=1200.0)
    parser.add_argument("--output", action="append", default=[])
    parser.add_argument("--plot", help="weak-scaling plot (PNG)")
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.backends = common.parse_backends(args.backends)
    except ValueError as exc:
        parser.error(str(exc))
    sizes = args.allreduce_sizes or ",".join(QUICK_ALLREDUCE_SIZES if args.quick
                                             else ALLREDUCE_SIZES)
    try:
        args.world_sizes = [int(p) for p in (args.world_sizes or
                                             ("1,2" if args.quick else "1,2,4")).split(",")]
        args.reduce_sizes = [] if sizes == "none" else common.parse_size_list(sizes)
    except ValueError as exc:
        parser.error(f"--world-sizes or --allreduce-sizes: {exc}")
    if min(args.world_sizes) < 1:
        parser.error(f"--world-sizes must be >= 1, got {args.world_sizes}")
    names = args.models.split(",") if args.models else (QUICK_MODELS if args.quick else MODELS)
    try:
        args.model_sizes = [MODELS[n] if n in MODELS else [int(k) for k in n.split("-")]
                            for n in (n.strip() for n in names)]
    except ValueError:
        parser.error(f"--models: cannot read {args.models!r}; use {list(MODELS)} or 784-256-10")
    if any(len(s) < 2 or min(s) < 1 for s in args.model_sizes) or args.batch < 1:
        parser.error(f"bad --models {args.models!r} or --batch {args.batch}")
    args.steps = args.steps or (4 if args.quick else 10)
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    reduce_rows, failures = [], []
    comm_sizes = [p for p in args.world_sizes if p > 1]
    if args.reduce_sizes and comm_sizes:
        reduce_rows, failures = bench_collectives.measure(
            args.backends, comm_sizes, {"all_reduce": args.reduce_sizes}, args.iters,
            args.job_timeout)
    train_rows, train_failures = measure_training(
        args.backends, args.world_sizes, args.model_sizes, args.batch, args.steps, args.warmup,
        args.job_timeout)
    failures += train_failures
    common.publish(report(reduce_rows, train_rows, failures, args.backends, command, machine),
                   args.output, SECTION)
    if args.plot:
        plot(train_rows, args.plot)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/distributed_training_benchmark.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
