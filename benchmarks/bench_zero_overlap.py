"""ZeroRedundancyOptimizer stepping inside DDP's backward (``overlap_with_ddp=True``) against
DDP with the plain optimizer: step time, measured alternating in one job, and bytes per step.

One MLP (float32, Adam, cross-entropy, one BLAS thread per rank), DDP buckets of ``--bucket-mb``
so that there are several; five replicas of the same weights step in turn on the same batch,
the order rotating every round (``bench_common.interleaved_step_ms``):
- ``ddp``: DDP, then ``Adam.step()`` after backward;
- ``ddp_hook``: the same with torch's ``allreduce_hook`` registered (``register_comm_hook``):
  what any hooked DDP pays beside the plain one;
- ``zero``: DDP, then ``ZeroRedundancyOptimizer.step()`` (its share, then an all-gather; on
  shm the shares pass through shared memory instead);
- ``overlap``: ``hook_with_zero_step(allreduce_hook, ...)``: each owner updates its buckets
  once the last bucket is launched, the updates broadcast while later averages travel;
- ``interleaved``: ``hook_with_zero_step_interleaved``: bucket k-1 updated as bucket k launches.
On shm both ZeRO hooks run on DDP's shared buckets: the buckets are averaged as without a hook,
then each owner updates its parameters, which live in shared memory, and the others copy them
out (no broadcast, so no bytes sent).
Reported per backend: the slowest rank's median step and its ratio to ``ddp``'s, and on tcp the
payload bytes the most loaded rank's transport sent in one step (``transports.sent_bytes``)
beside the formula for Ψ float32 parameters at world N: 2(N-1)/N·4Ψ for DDP's ring all-reduce,
3(N-1)/N·4Ψ for ZeRO (the all-reduce plus every rank receiving the (N-1)/N it does not own).
A broadcast's root sends its bucket to each child of its tree, so the owner of the most
elements sends more than the average rank (at N = 2: its share, not half the model).

    python benchmarks/bench_zero_overlap.py [--quick] [--world-size 2] [--sizes 512,1024,...]
        [--batch 64] [--bucket-mb 1] [--steps 40] [--backends shm,tcp]
        [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Dict, Optional, Sequence  # noqa: E402

SECTION = "bench_zero_overlap"
SCRIPT = os.path.abspath(__file__)
MiB = 1 << 20
SIZES = [512, 1024, 1024, 1024, 1024, 10]
QUICK_SIZES = [32, 64, 64, 64, 10]
PATHS = ("ddp", "ddp_hook", "zero", "overlap", "interleaved")
FORMULA = {"ddp": 2, "ddp_hook": 2, "zero": 3, "overlap": 3, "interleaved": 3}  # × (N-1)/N · 4Ψ


def _runner(path: str, job: Dict[str, Any]):
    """One training step of ``path`` on this rank's batch, as a script writes it."""
    import numpy as np

    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed import DistributedDataParallel, get_rank
    from neural_arch.distributed.comm_hooks import (allreduce_hook, hook_with_zero_step,
                                                    hook_with_zero_step_interleaved)
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.models import MLP
    from neural_arch.optim import Adam
    manual_seed(0)
    ddp = DistributedDataParallel(MLP(job["sizes"]), bucket_size_mb=job["bucket_mb"])
    if path in ("ddp", "ddp_hook"):
        opt = Adam(ddp.parameters(), lr=1e-4)
    else:
        opt = ZeroRedundancyOptimizer(ddp.parameters(), Adam, lr=1e-4,
                                      overlap_with_ddp=path != "zero")
    if path == "ddp_hook":
        ddp.register_comm_hook(None, allreduce_hook)
    if path in ("overlap", "interleaved"):
        wrap = hook_with_zero_step if path == "overlap" else hook_with_zero_step_interleaved
        ddp.register_comm_hook(None, wrap(allreduce_hook, ddp, opt))
    rng = np.random.default_rng(1000 + get_rank())
    x = Tensor(rng.standard_normal((job["batch"], job["sizes"][0])).astype(np.float32))
    y = Tensor(rng.integers(0, job["sizes"][-1], job["batch"]).astype(np.int64))

    def step() -> None:
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        opt.step()
    return step, len(ddp.bucket_parameters())


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.distributed.transports.sent_bytes import counting_sent_bytes
    built = {path: _runner(path, job) for path in PATHS}
    runners = {path: step for path, (step, _) in built.items()}
    sent = {}
    for path, step in runners.items():  # one step each, counted (0 on shm: no messages)
        dist.barrier()
        with counting_sent_bytes() as tally:
            step()
        sent[path] = tally.counted
    ms = common.interleaved_step_ms(runners, job["steps"], job["warmup"])
    everyone = dist.all_gather_object((ms, sent))
    return {"backend": job["backend"], "world_size": dist.get_world_size(),
            "buckets": built["ddp"][1],
            "step_ms": {p: max(e[0][p] for e in everyone) for p in PATHS},
            "sent": {p: max(e[1][p] for e in everyone) for p in PATHS}}


# ----- the driver ------------------------------------------------------------------------------
def report(results, failures, command: str, machine: str, job: Dict[str, Any]) -> str:
    psi = common.parameter_count(job["sizes"])
    lines = common.section_head(
        "ZeRO-1 stepping inside DDP's backward (`benchmarks/bench_zero_overlap.py`)",
        command, machine,
        f"MLP {common.model_name(job['sizes'])} (Ψ = {psi}), batch {job['batch']} per rank, "
        f"float32, Adam, DDP buckets {job['bucket_mb']} MiB; the five paths step in turn "
        f"(order rotating), slowest rank's median of {job['steps']} steps after "
        f"{job['warmup']} warm-up rounds; bytes: one step per path on tcp.")
    lines += [f"Failed job: {f}" for f in failures]
    by_backend = {r["backend"]: r for r in results}
    if not results:
        return "\n".join(lines)
    n = results[0]["world_size"]
    lines += [f"### p = {n}, {results[0]['buckets']} DDP buckets", ""]
    body = []
    for path in PATHS:
        want = FORMULA[path] * (n - 1) / n * 4 * psi
        row = [path, f"{FORMULA[path]}(N-1)/N", f"{want / MiB:.3f}"]
        tcp = by_backend.get("tcp")
        row += [f"{tcp['sent'][path] / MiB:.3f}", f"{tcp['sent'][path] / want:.3f}"] \
            if tcp else ["–", "–"]
        for backend in ("shm", "tcp"):
            r = by_backend.get(backend)
            row += [f"{r['step_ms'][path]:.2f}",
                    f"{r['step_ms'][path] / r['step_ms']['ddp']:.2f}"] if r else ["–", "–"]
        body.append(row)
    lines.append(common.markdown_table(
        ["path", "formula (× 4Ψ)", "formula (MiB)", "sent per step (MiB, tcp)",
         "sent / formula", "step shm (ms)", "× ddp shm", "step tcp (ms)", "× ddp tcp"], body))
    return "\n".join(lines)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a tiny MLP, few steps")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--sizes", help="MLP layer widths (default "
                        f"{','.join(map(str, SIZES))}; quick {','.join(map(str, QUICK_SIZES))})")
    parser.add_argument("--batch", type=int, help="rows per rank (default 64; quick 8)")
    parser.add_argument("--bucket-mb", type=float, help="DDP bucket size (default 1; quick 0.01)")
    parser.add_argument("--steps", type=int, help="timed steps per path (default 40; quick 2)")
    parser.add_argument("--warmup", type=int, help="default 2 (quick 1)")
    parser.add_argument("--backends", default="shm,tcp",
                        help="shm, tcp or both (bytes are counted on tcp only)")
    parser.add_argument("--job-timeout", type=float, default=600.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else \
            list(QUICK_SIZES if args.quick else SIZES)
    except ValueError:
        parser.error(f"cannot read --sizes {args.sizes!r}")
    args.batch = args.batch or (8 if args.quick else 64)
    args.bucket_mb = args.bucket_mb or (0.01 if args.quick else 1.0)
    args.steps = args.steps or (2 if args.quick else 40)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    try:
        args.backends = common.parse_backends(args.backends)
    except ValueError as exc:
        parser.error(str(exc))
    if not set(args.backends) <= {"shm", "tcp"}:
        parser.error(f"--backends takes shm, tcp or both, got {args.backends}")
    if args.world_size < 2 or len(args.sizes) < 2 or min(args.sizes + [args.batch]) < 1 \
            or args.steps < 1 or args.warmup < 0 or args.bucket_mb <= 0:
        parser.error(f"--world-size >= 2, at least two --sizes, positive --batch, --steps and "
                     f"--bucket-mb, --warmup >= 0; got {vars(args)}")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"sizes": args.sizes, "batch": args.batch, "bucket_mb": args.bucket_mb,
           "steps": args.steps, "warmup": args.warmup}
    n = args.world_size
    results, failures = common.run_jobs(
        SCRIPT, [(f"{b}, {n} ranks", b, n) for b in args.backends], job, args.job_timeout)
    common.publish(report(results, failures, command, machine, job), args.output, SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_zero_overlap.py", parse_args, worker,
                              drive)


if __name__ == "__main__":
    sys.exit(main())
