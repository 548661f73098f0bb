"""Convolutional training steps against torch CPU: one Conv2d layer and resnet8, at p = 1 and
data parallel at p = 2.

A step: zero_grad, forward, cross-entropy, backward, SGD; float32, the same architecture in
both, torch loaded with ours' initial weights (the first step's losses are checked equal);
the median of interleaved steps after a warm-up (``conv_jobs``).
- p = 1, one thread: OpenMP/BLAS threads 1 for both and ``torch.set_num_threads(1)``.
- p = 1, default threads: the same in a child process with the thread variables unset and
  torch's default thread count.
- p = 2: resnet8, our ``DistributedDataParallel`` on shm and torch's DDP on gloo in the same
  two rank processes (one thread each), half the batch per rank; the slower rank's medians.
Goal: neural_arch <= 1.5x torch per row, judged on the printed ratio.

    python benchmarks/bench_conv.py [--quick] [--batch 64] [--image 32] [--steps 10]
        [--warmup 2] [--no-ddp] [--no-default-threads] [--no-torch]
        [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

_CHILD_FLAG = "--default-threads-child"
if _CHILD_FLAG not in sys.argv:  # the child measures the machine's default thread counts
    common.one_thread_per_rank()

import argparse  # noqa: E402
import json  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
from typing import Any, Dict, List, Optional, Sequence  # noqa: E402

import conv_jobs as jobs  # noqa: E402

GOAL = 1.5
SECTION = "bench_conv"
SCRIPT = os.path.abspath(__file__)
NO_TORCH = "torch not installed: peer rows skipped"


def load_torch(skip: bool, threads: Optional[int]):
    if skip:
        return None
    try:
        import torch
    except ImportError:
        return None
    if threads:
        torch.set_num_threads(threads)
    return torch


def thread_counts(torch) -> str:
    """What 'default threads' was on this machine: BLAS's and torch's thread counts."""
    try:
        from threadpoolctl import threadpool_info
        blas = max((info["num_threads"] for info in threadpool_info()), default=1)
    except ImportError:
        blas = os.cpu_count()
    return f"{blas}" + (f" / {torch.get_num_threads()}" if torch is not None else "")


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    return jobs.ddp_worker(job)


def child_default_threads(args: argparse.Namespace) -> int:
    torch = load_torch(args.no_torch, None)
    result = {"threads": thread_counts(torch),
              "models": jobs.time_models(torch, args.models, args.batch, args.image,
                                         args.steps, args.warmup)}
    with open(args.default_threads_child, "w", encoding="utf-8") as handle:
        json.dump(result, handle)
    return 0


def run_default_threads(args: argparse.Namespace, argv: Sequence[str]) -> Dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in common.THREAD_VARS}
    with tempfile.TemporaryDirectory(prefix="nf_bench_conv_") as folder:
        out = os.path.join(folder, "result.json")
        code = subprocess.run([sys.executable, SCRIPT, *argv, _CHILD_FLAG, out], env=env,
                              timeout=args.job_timeout).returncode
        if code != 0 or not os.path.exists(out):
            raise common.JobFailed(f"the default-threads run exited with code {code}")
        with open(out, encoding="utf-8") as handle:
            return json.load(handle)


def rows_of(models: Dict[str, Any], p: int, threads: str, batch: int) -> List[Dict[str, Any]]:
    return [{"model": model, "p": p, "threads": threads, "batch": batch, **result}
            for model, result in models.items()]


def main_table(rows: List[Dict[str, Any]]) -> List[str]:
    body, judged, passed = [], 0, 0
    for r in rows:
        ours = r["neural_arch"]["step"]
        cells = [jobs.MODEL_TITLES[r["model"]], r["p"], r["threads"], r["batch"],
                 f"{ours:.2f}"]
        if "torch" in r:
            ratio = round(ours / r["torch"]["step"], 2)  # judged as shown
            judged, passed = judged + 1, passed + (ratio <= GOAL)
            cells += [f"{r['torch']['step']:.2f}", f"{ratio:.2f}",
                      common.verdict(ratio <= GOAL)]
        else:
            cells += ["—", "—", common.verdict(None)]
        body.append(cells)
    table = common.markdown_table(
        ["model", "p", "threads", "batch per rank", "neural_arch ms", "torch ms",
         "neural_arch / torch", f"≤ {GOAL}×"], body, "lrlrrrrl")
    outcome = f"{passed} of {judged} rows PASS" if judged else common.verdict(None)
    return [table, "", f"Goal neural_arch ≤ {GOAL}× torch: {outcome}."]


def phase_table(rows: List[Dict[str, Any]]) -> List[str]:
    body = []
    for r in rows:
        for name in ("neural_arch", "torch"):
            if name in r:
                t = r[name]
                body.append([jobs.MODEL_TITLES[r["model"]], r["p"], r["threads"], name,
                             f"{t['forward']:.2f}", f"{t['backward']:.2f}",
                             f"{t['update']:.2f}", f"{t['step']:.2f}"])
    return ["Where the time goes (median ms per phase; the medians need not add up to the "
            "step's):", "",
            common.markdown_table(["model", "p", "threads", "framework", "zero_grad + forward "
                                   "+ loss", "backward", "SGD", "step"], body, "lrllrrrr")]


def report(rows, failures, command: str, machine: str, args, torch) -> str:
    peer = f"torch {torch.__version__}" if torch is not None else NO_TORCH
    lines = common.section_head(
        "Convolutional training step against PyTorch (`benchmarks/bench_conv.py`)", command,
        f"{machine}; {peer}",
        f"A step: zero_grad, forward, cross-entropy, backward, SGD (lr {jobs.LR}); float32, "
        f"batch {args.batch} of 3×{args.image}×{args.image} images, the same architecture "
        f"and initial weights in both (first-step losses checked equal); median of "
        f"{args.steps} interleaved steps after {args.warmup} warm-up. Conv2d row: one 3→16 "
        f"3×3 convolution, global average pooling, 16-way cross-entropy. *threads* 1: "
        f"OpenMP/BLAS and torch set to one thread; otherwise the defaults (BLAS / torch). "
        f"p = 2: resnet8 data parallel, ours on shm, torch's DDP on gloo, in the same two "
        f"processes (one thread each), batch {args.batch // 2} per rank; the slower rank's "
        f"median. The machine has {os.cpu_count()} cores and was shared with other work "
        f"while this ran: treat single numbers with care.")
    lines += [f"Failed: {f}" for f in failures]
    if torch is None:
        lines += [NO_TORCH + " (the p = 2 row too: it steps both in the same processes).", ""]
    return "\n".join(lines + main_table(rows) + [""] + phase_table(rows))


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument(_CHILD_FLAG, help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="batch 8, 16×16 images, 2 steps")
    parser.add_argument("--batch", type=int, help="images per step (default 64; quick 8); "
                        "p = 2 gives each rank half")
    parser.add_argument("--image", type=int, help="image side (default 32; quick 16)")
    parser.add_argument("--steps", type=int, help="timed steps (default 10; quick 2)")
    parser.add_argument("--warmup", type=int, help="warm-up steps (default 2; quick 1)")
    parser.add_argument("--models", default=",".join(jobs.MODELS),
                        help=f"p = 1 models, from {','.join(jobs.MODELS)}")
    parser.add_argument("--no-ddp", action="store_true", help="skip the p = 2 row")
    parser.add_argument("--no-default-threads", action="store_true",
                        help="skip the default-threads rows")
    parser.add_argument("--no-torch", action="store_true", help="skip torch even if installed")
    parser.add_argument("--job-timeout", type=float, default=900.0)
    parser.add_argument("--output", action="append", default=[])
    args = parser.parse_args(argv)
    args.batch = args.batch or (8 if args.quick else 64)
    args.image = args.image or (16 if args.quick else 32)
    args.steps = args.steps or (2 if args.quick else 10)
    args.warmup = (1 if args.quick else 2) if args.warmup is None else args.warmup
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if any(m not in jobs.MODELS for m in args.models) or args.batch < 2 or args.batch % 2 \
            or args.image < 4 or args.steps < 1 or args.warmup < 1:
        parser.error(f"--models from {jobs.MODELS}, an even --batch >= 2 (p = 2 halves it), "
                     f"--image >= 4, --steps >= 1, --warmup >= 1 (the first step checks the "
                     f"losses); got {vars(args)}")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    torch = load_torch(args.no_torch, 1)
    if torch is None:
        print(NO_TORCH if not args.no_torch else "--no-torch: peer rows skipped", flush=True)
    print("== p = 1, one thread", flush=True)
    rows = rows_of(jobs.time_models(torch, args.models, args.batch, args.image, args.steps,
                                    args.warmup), 1, "1", args.batch)
    failures = []
    if not args.no_default_threads:
        print("== p = 1, default threads", flush=True)
        try:
            child = run_default_threads(args, _child_argv(args))
            rows += rows_of(child["models"], 1, child["threads"], args.batch)
        except (common.JobFailed, subprocess.TimeoutExpired) as exc:
            failures.append(str(exc))
    if not args.no_ddp and torch is not None:
        job = {"model": "resnet8", "batch": args.batch // 2, "image": args.image,
               "steps": args.steps, "warmup": args.warmup}
        results, job_failures = common.run_jobs(
            SCRIPT, [("p = 2, resnet8: DistributedDataParallel (shm) and torch DDP (gloo)",
                      "shm", 2)], job, args.job_timeout)
        failures += job_failures
        rows += [{"model": "resnet8", "p": 2, "threads": "1", "batch": args.batch // 2, **r}
                 for r in results]
    common.publish(report(rows, failures, command, machine, args, torch), args.output, SECTION)
    return 1 if failures else 0


def _child_argv(args: argparse.Namespace) -> List[str]:
    return ["--batch", str(args.batch), "--image", str(args.image), "--steps", str(args.steps),
            "--warmup", str(args.warmup), "--models", ",".join(args.models)] + \
        (["--no-torch"] if args.no_torch else [])


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = parse_args(argv)
    if args.default_threads_child:
        return child_default_threads(args)
    return common.entry_point(argv, "benchmarks/bench_conv.py", lambda _: args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
