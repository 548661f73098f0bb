"""DDP on shm: buckets in shared memory against the copy path (private buckets + all_reduce).

Gradient sync: one MLP per size holds fixed random float32 gradients; two
DistributedDataParallel wrappers of it differ only in ``shared_buckets`` (True / False) and
time ``sync_gradients()`` alternately (the order flips every round, so drift in the machine's
load hits both alike), each round right after a barrier. Reported: the slowest rank's median.
Training step: two replicas of 784-1024-1024-10 (one per storage) take alternate SGD steps
(forward, cross-entropy, backward, ``sync_gradients()``, update) on a fixed batch per rank, in
manual and automatic (overlapped) sync. One BLAS thread per rank; 25 MiB buckets.

    python benchmarks/bench_ddp_buckets.py [--quick] [--world-sizes 2,4] [--repeats 9]
        [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
from bench_common import model_name, parameter_count  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence  # noqa: E402

SYNC_MODELS = {"2M": [784, 1024, 1024, 10], "10M": [784, 2048, 2048, 2048, 10],
               "50M": [784, 4096, 4096, 4096, 4096, 10]}
QUICK_SYNC_MODELS = ("2M", "10M")
STEP_MODEL = [784, 1024, 1024, 10]
STORAGES = ("copy", "shared")
SECTION = "bench_ddp_buckets"
SCRIPT = os.path.abspath(__file__)


# ----- one rank of a job ---------------------------------------------------------------------
def _interleaved(calls: Dict[str, Any], rounds: int, warmup: int) -> Dict[str, List[float]]:
    """Seconds of each call per round, alternating which storage goes first."""
    import time

    from neural_arch import distributed as dist
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for i in range(warmup + rounds):
        order = list(calls) if i % 2 == 0 else list(reversed(list(calls)))
        for name in order:
            dist.barrier()
            start = time.perf_counter()
            calls[name]()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times


def _slowest(times: Dict[str, List[float]]) -> Dict[str, float]:
    from neural_arch import distributed as dist
    everyone = dist.all_gather_object(times)
    return {name: common.slowest_median([t[name] for t in everyone]) for name in times}


def _sync_rows(job: Dict[str, Any]) -> List[dict]:
    import gc

    import numpy as np

    from neural_arch import distributed as dist
    from neural_arch.models import MLP
    rows = []
    for sizes in job["sync_models"]:
        module = MLP(sizes)
        rng = np.random.default_rng(dist.get_rank())
        for p in module.parameters():
            p.grad = rng.standard_normal(p.array.shape).astype(np.float32)
        wrappers = {s: dist.DistributedDataParallel(module, shared_buckets=s == "shared")
                    for s in STORAGES}
        assert wrappers["shared"].shared_buckets and not wrappers["copy"].shared_buckets
        medians = _slowest(_interleaved({s: w.sync_gradients for s, w in wrappers.items()},
                                        job["repeats"], job["warmup"]))
        rows.append(dict(model=model_name(sizes), params=parameter_count(sizes),
                         buckets=len(wrappers["shared"]._buckets), **medians))
        if dist.get_rank() == 0:
            print(f"sync {model_name(sizes)} p={dist.get_world_size()}: copy "
                  f"{medians['copy'] * 1e3:.1f} ms, shared {medians['shared'] * 1e3:.1f} ms",
                  flush=True)
        del wrappers, module
        gc.collect()  # unmaps the arena before the next, larger model
    return rows


def _step_rows(job: Dict[str, Any]) -> List[dict]:
    import numpy as np

    import neural_arch.functional as F
    from neural_arch import distributed as dist
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    rank, rows = dist.get_rank(), []
    rng = np.random.default_rng(1000 + rank)
    x = rng.standard_normal((job["batch"], STEP_MODEL[0])).astype(np.float32)
    y = rng.integers(0, STEP_MODEL[-1], job["batch"]).astype(np.int64)
    for mode in ("manual", "auto"):
        steps, waits = {}, {}
        for storage in STORAGES:
            manual_seed(0)
            model = dist.DistributedDataParallel(MLP(STEP_MODEL), auto_sync=mode == "auto",
                                                 shared_buckets=storage == "shared")
            optimizer = SGD(model.parameters(), lr=0.01)
            waits[storage] = []

            def step(model=model, optimizer=optimizer, waited=waits[storage]):
                before = model.comm_stats()["waited_s"]
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                model.sync_gradients()
                waited.append(model.comm_stats()["waited_s"] - before)
                optimizer.step()
            steps[storage] = step
        medians = _slowest(_interleaved(steps, job["steps"], job["warmup"]))
        # the backward thread's wait on gradient communication in each step (DDP's own clock,
        # comm_stats): with overlap, only what backward did not hide
        waited = _slowest({s: w[job["warmup"]:] for s, w in waits.items()})
        rows.append(dict(model=model_name(STEP_MODEL), params=parameter_count(STEP_MODEL),
                         mode=mode, batch=job["batch"], waited=waited, **medians))
        if rank == 0:
            print(f"step {mode} p={dist.get_world_size()}: copy {medians['copy'] * 1e3:.1f} ms, "
                  f"shared {medians['shared'] * 1e3:.1f} ms", flush=True)
    return rows


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    return {"world_size": dist.get_world_size(), "sync": _sync_rows(job),
            "step": _step_rows(job)}


# ----- the driver ------------------------------------------------------------------------------
def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3f}" if ms < 10 else f"{ms:.2f}" if ms < 100 else f"{ms:.1f}"


def _params(count: int) -> str:
    return f"{count / 1e6:.1f}M"


def report(results: Sequence[dict], failures: Sequence[str], command: str, machine: str,
           job: Dict[str, Any], load_after: Optional[float] = None) -> str:
    lines = common.section_head(
        "DDP buckets in shared memory (`benchmarks/bench_ddp_buckets.py`)", command, machine,
        "Backend shm, float32, 25 MiB buckets, one BLAS thread per rank. Copy path: private "
        "buckets averaged by `all_reduce` (direct shared-memory algorithm: copy in, reduce, "
        "copy out; with two ranks copy in, and both ranks reduce). Shared: buckets live in the shared segment (`shared_buckets=True`). "
        f"Both storages alternate round by round; slowest rank's median of {job['repeats']} "
        f"syncs / {job['steps']} steps after {job['warmup']} warm-up rounds. "
        "Speedup: copy time / shared time."
        + ("" if load_after is None else f" Load average {load_after:.2f} at the end."))
    sync_body, step_body, wait_body = [], [], []
    for result in results:
        p = result["world_size"]
        for r in result["sync"]:
            sync_body.append([f"{r['model']} ({_params(r['params'])})", str(p),
                              str(r["buckets"]), _ms(r["copy"]), _ms(r["shared"]),
                              f"{r['copy'] / r['shared']:.2f}x"])
        for r in result["step"]:
            step_body.append([f"{r['model']} ({_params(r['params'])})", str(p), r["mode"],
                              str(r["batch"]), _ms(r["copy"]), _ms(r["shared"]),
                              f"{r['copy'] / r['shared']:.2f}x"])
            wait_body.append([f"{r['model']} ({_params(r['params'])})", str(p), r["mode"],
                              _ms(r["copy"]), _ms(r["waited"]["copy"]),
                              _ms(r["shared"]), _ms(r["waited"]["shared"])])
    lines += [f"Failed job: {f}" for f in failures]
    lines += ["### sync_gradients()", "", common.markdown_table(
        ["model (params)", "p", "buckets", "copy path (ms)", "shared buckets (ms)", "speedup"],
        sync_body), ""]
    lines += ["### Training step", "", common.markdown_table(
        ["model (params)", "p", "sync", "batch/rank", "copy path (ms)", "shared buckets (ms)",
         "speedup"], step_body, "lrlrrrr"), ""]
    lines += ["### Step time waiting on communication", "",
              "What the thread that ran backward spent waiting for gradient averaging in a "
              "step (`DistributedDataParallel.comm_stats()`, slowest rank's median), before "
              "(copy path) and after (shared buckets): in manual sync the whole "
              "`sync_gradients()`, with overlap only what backward did not hide.", "",
              common.markdown_table(
                  ["model (params)", "p", "sync", "copy path step (ms)", "copy path waiting (ms)",
                   "shared step (ms)", "shared waiting (ms)"], wait_body, "lrlrrrr")]
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true",
                        help=f"models {', '.join(QUICK_SYNC_MODELS)}, p=2, fewer rounds")
    parser.add_argument("--world-sizes", help="default 2,4 (quick: 2)")
    parser.add_argument("--models", help=f"sync models among {', '.join(SYNC_MODELS)} or "
                        "layer sizes like 784-1024-10, comma-separated")
    parser.add_argument("--repeats", type=int, help="timed syncs per storage (default 9)")
    parser.add_argument("--steps", type=int, help="timed training steps (default 15)")
    parser.add_argument("--batch", type=int, default=256, help="samples per rank")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--job-timeout", type=float, default=1800.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.world_sizes = [int(p) for p in (args.world_sizes or
                                             ("2" if args.quick else "2,4")).split(",")]
        names = args.models.split(",") if args.models else (
            QUICK_SYNC_MODELS if args.quick else list(SYNC_MODELS))
        args.sync_models = [SYNC_MODELS[n] if n in SYNC_MODELS else
                            [int(k) for k in n.split("-")] for n in (n.strip() for n in names)]
    except ValueError:
        parser.error(f"cannot read --world-sizes {args.world_sizes!r} or --models "
                     f"{args.models!r}")
    if min(args.world_sizes) < 2 or any(len(s) < 2 or min(s) < 1 for s in args.sync_models):
        parser.error(f"--world-sizes must be >= 2 and models need >= 2 positive layer sizes, "
                     f"got {args.world_sizes} and {args.sync_models}")
    args.repeats = args.repeats or (3 if args.quick else 9)
    args.steps = args.steps or (4 if args.quick else 15)
    if min(args.repeats, args.steps, args.batch) < 1 or args.warmup < 0:
        parser.error("--repeats, --steps and --batch must be >= 1 and --warmup >= 0")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"sync_models": args.sync_models, "repeats": args.repeats, "steps": args.steps,
           "batch": args.batch, "warmup": args.warmup}
    results, failures = common.run_jobs(
        SCRIPT, [(f"shm, {p} ranks", "shm", p) for p in args.world_sizes], job, args.job_timeout)
    load_after = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    common.publish(report(results, failures, command, machine, job, load_after), args.output,
                   SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_ddp_buckets.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
