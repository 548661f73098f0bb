"""DDP's fp16 sync against what it is made of, in the same processes: where its time goes.

One job per backend and world size trains, step by step in turn (so that the machine's load
weighs on each alike), the MLP of ``bench_compression`` three ways on the same batches: DDP
without a hook, DDP with ``fp16_compress_hook``, and a plain replica whose gradients are
averaged by hand the way that hook's bits are made (each gradient cast into one float16 vector
by the compiled cast, one synchronous ``all_reduce`` AVERAGE of it, each gradient widened
back). Each sync starts right after a barrier that follows the backward. Between the steps,
the all-reduce alone of a float16 and of a float32 vector of the bucket's size is timed too.
Reported: the slowest rank's median of each, after the first tenth of the steps; then what
DDP adds to the by-hand sync, what the two casts cost, and the ratios of the syncs.

    python benchmarks/bench_fp16_sync.py [--backends tcp] [--world-sizes 2] [--steps 60]
        [--hidden 2048] [--output FILE]
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

VARIANTS = ("DDP, no hook", "DDP, fp16 hook", "by hand (casts + all_reduce)",
            "all_reduce float16 alone", "all_reduce float32 alone")
BATCH, LR = 32, 0.1
SECTION = "bench_fp16_sync"
SCRIPT = os.path.abspath(__file__)


# ----- one rank of a job ---------------------------------------------------------------------
def _by_hand(params: List[Any], wire):
    """The fp16 hook's average done by hand on ``params``' gradients (see the docstring)."""
    import numpy as np

    from neural_arch import distributed as dist
    from neural_arch.distributed.reductions.kernels import to_float16, to_float32

    def sync() -> None:
        grads = [p.grad.array.reshape(-1) for p in params]
        bounds = np.cumsum([0] + [g.size for g in grads])
        for g, lo, hi in zip(grads, bounds[:-1], bounds[1:]):
            to_float16(g, wire[lo:hi])
        dist.all_reduce(wire, dist.ReduceOp.AVERAGE)
        for g, lo, hi in zip(grads, bounds[:-1], bounds[1:]):
            to_float32(wire[lo:hi], g)
    return sync


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    import time

    import numpy as np

    import neural_arch.functional as F
    from neural_arch import distributed as dist
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.data import load_digits
    from neural_arch.distributed.comm_hooks import CommHookState, fp16_compress_hook
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    rank, world = dist.get_rank(), dist.get_world_size()
    (x, y), _ = (d.arrays for d in load_digits(seed=0))
    sizes = [64, job["hidden"], job["hidden"], 10]
    trained = []  # (name, model to run forward and backward on, its sync, optimizer)
    for name in VARIANTS[:3]:
        manual_seed(0)
        if name.startswith("DDP"):
            model = dist.DistributedDataParallel(MLP(sizes), auto_sync=False)
            if "fp16" in name:
                model.register_comm_hook(CommHookState(), fp16_compress_hook)
            sync = model.sync_gradients
        else:
            model = MLP(sizes)
            params = list(model.parameters())[::-1]  # DDP's bucket order
            sync = _by_hand(params, np.empty(sum(p.array.size for p in params), np.float16))
        trained.append((name, model, sync, SGD(model.parameters(), lr=LR)))
    count = parameter_count(sizes)
    alone = [(VARIANTS[3], np.ones(count, np.float16)), (VARIANTS[4], np.ones(count, np.float32))]
    times: Dict[str, List[float]] = {name: [] for name in VARIANTS}
    rng = np.random.default_rng(1)
    for _ in range(job["steps"]):
        rows = rng.permutation(len(y))[rank::world][:BATCH]
        for name, model, sync, opt in trained:
            opt.zero_grad()
            F.cross_entropy(model(Tensor(x[rows])), Tensor(y[rows])).backward()
            dist.barrier()
            began = time.perf_counter()
            sync()
            times[name].append(time.perf_counter() - began)
            opt.step()
        for name, vector in alone:
            dist.barrier()
            began = time.perf_counter()
            dist.all_reduce(vector, dist.ReduceOp.AVERAGE)
            times[name].append(time.perf_counter() - began)
    gathered = dist.all_gather_object({k: v[len(v) // 10:] for k, v in times.items()})
    return {"backend": job["backend"], "world_size": world,
            "ms": {k: common.slowest_median([g[k] for g in gathered]) * 1e3 for k in VARIANTS}}


# ----- the driver ------------------------------------------------------------------------------
def report(results: Sequence[dict], failures: Sequence[str], command: str, machine: str,
           job: Dict[str, Any]) -> str:
    sizes = [64, job["hidden"], job["hidden"], 10]
    lines = common.section_head(
        "DDP's fp16 sync and its parts (`benchmarks/bench_fp16_sync.py`)", command, machine,
        f"MLP {model_name(sizes)} ({parameter_count(sizes) / 1e3:.0f}K float32 parameters, one "
        f"bucket) on digits, {job['steps']} steps, {BATCH} samples per rank and step; the "
        "variants take turns step by step in one job; slowest rank's median per sync (right "
        "after a barrier) after the first tenth of the steps. By hand: the fp16 hook's bits "
        "without DDP (compiled casts per gradient, one synchronous all_reduce AVERAGE).")
    lines += [f"Failed job: {f}" for f in failures]
    body = []
    for result in results:
        ms = result["ms"]
        ddp16, hand, f16, f32 = (ms[VARIANTS[1]], ms[VARIANTS[2]], ms[VARIANTS[3]],
                                 ms[VARIANTS[4]])
        body.append([result["backend"], str(result["world_size"])]
                    + [f"{ms[k]:.2f}" for k in VARIANTS]
                    + [f"{ddp16 - hand:+.2f}", f"{hand - f16:.2f}",
                       f"{ms[VARIANTS[0]] / ddp16:.2f}x", f"{f32 / f16:.2f}x"])
    lines += [common.markdown_table(
        ["backend", "p", "DDP none (ms)", "DDP fp16 (ms)", "by hand (ms)", "f16 alone (ms)",
         "f32 alone (ms)", "DDP adds (ms)", "casts (ms)", "none / fp16", "f32 / f16"],
        body, "llrrrrrrrrr"), ""]
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--backends", default="tcp")
    parser.add_argument("--world-sizes", default="2")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--job-timeout", type=float, default=600.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.world_sizes = [int(p) for p in args.world_sizes.split(",")]
        args.backends = common.parse_backends(args.backends)
    except ValueError as exc:
        parser.error(str(exc))
    if args.steps < 2 or args.hidden < 1 or min(args.world_sizes) < 2:
        parser.error(f"--steps must be >= 2, --hidden >= 1 and --world-sizes >= 2, got "
                     f"{args.steps}, {args.hidden} and {args.world_sizes}")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"steps": args.steps, "hidden": args.hidden}
    plan = [(f"{b}, {p} ranks", b, p) for b in args.backends for p in args.world_sizes]
    results, failures = common.run_jobs(SCRIPT, plan, job, args.job_timeout)
    common.publish(report(results, failures, command, machine, job), args.output, SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_fp16_sync.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
