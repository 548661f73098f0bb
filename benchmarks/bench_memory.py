"""Memory per rank of data parallel and ZeRO-1/2/3, measured, beside the ZeRO paper's formula.

One GPT (float32, Adam) per job; each rank measures with ``tracemalloc`` (NumPy reports its
buffers to it), from just before the model is built:
- model states at rest: bytes held after two training steps (parameters, gradients, optimizer
  state and whatever buffers the strategy keeps), plus the full parameters FSDP holds in
  memory maps (``memory_stats()``; tracemalloc does not see those);
- peak of a third step: tracemalloc's peak plus FSDP's peak of gathered bytes.
The formula for Psi parameters, fp32 Adam: DDP 16 Psi; ZeRO-1 8 Psi + 8 Psi/N; ZeRO-2
4 Psi + 12 Psi/N; ZeRO-3 16 Psi/N. DDP and ZeRO-1 run with private buckets whose gradients are
the parameters' ``.grad`` (``gradient_as_bucket_view=True``) and ZeRO-1 with
``parameters_as_bucket_view=True``, as a memory-minded PyTorch user would; ZeRO-2/3 wrap each
transformer block as a unit.

    python benchmarks/bench_memory.py [--quick] [--world-sizes 1,2,4] [--layers 4]
        [--width 256] [--output benchmarks/RESULTS.md] [--chart docs/sharding_memory.png]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402
import sharding_setup as setup  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
from typing import Any, Dict, Optional, Sequence  # noqa: E402

STRATEGIES = setup.STRATEGIES
SECTION = "bench_memory"
SCRIPT = os.path.abspath(__file__)
MiB = 1 << 20


def formula(strategy: str, psi: int, n: int) -> float:
    """Bytes of model states per rank (fp32 parameters and gradients, Adam's two moments)."""
    return {"DDP": 16 * psi, "ZeRO-1": 8 * psi + 8 * psi / n, "ZeRO-2": 4 * psi + 12 * psi / n,
            "ZeRO-3": 16 * psi / n}[strategy]


# ----- one rank of a job ---------------------------------------------------------------------
def _counted(model, optimizer) -> Dict[str, int]:
    """Bytes of the arrays each category holds, counted once each (a cross-check)."""
    def nbytes(arrays):
        seen, total = set(), 0
        for a in arrays:
            if a is not None and id(a) not in seen:
                seen.add(id(a))
                total += a.nbytes
        return total
    params = list(model.parameters())
    state = getattr(optimizer, "optim", optimizer).state
    grads = (p.grad.array for p in params if p.grad is not None)
    return {"params": nbytes(p.array for p in params), "grads": nbytes(grads),
            "optimizer": nbytes(v for p in state for v in state[p].values()
                                if hasattr(v, "nbytes") and getattr(v, "ndim", 0) > 0)}


def _measure(strategy: str, job: Dict[str, Any]) -> Dict[str, Any]:
    import gc
    import tracemalloc

    import numpy as np

    from neural_arch import distributed as dist
    rank = dist.get_rank()
    rng = np.random.default_rng(rank)
    idx = rng.integers(0, job["vocab"], (job["batch"], job["block"]))
    targets = rng.integers(0, job["vocab"], (job["batch"], job["block"]))
    psi = sum(p.array.size for p in setup.gpt(job).parameters())
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    # the memory-minded settings: DDP's gradients and ZeRO-1's parameters are bucket views
    model, optimizer, fsdp = setup.build(strategy, job, bucket_views=True)

    def step():
        optimizer.zero_grad()
        _, loss = model(idx, targets)
        loss.backward()
        optimizer.step()

    for _ in range(2):
        step()
    gc.collect()
    gathered = fsdp.memory_stats()["gathered_bytes"] if fsdp else 0
    at_rest = tracemalloc.get_traced_memory()[0] - base + gathered
    counted = _counted(model, optimizer)
    tracemalloc.reset_peak()
    if fsdp:
        fsdp.reset_peak_memory_stats()
    step()
    peak = tracemalloc.get_traced_memory()[1] - base
    peak_gathered = fsdp.memory_stats()["peak_gathered_bytes"] if fsdp else 0
    tracemalloc.stop()
    mine = dict(at_rest=at_rest, peak=peak + peak_gathered, gathered=gathered,
                peak_gathered=peak_gathered, **counted)
    everyone = dist.all_gather_object(mine)
    worst = {k: max(r[k] for r in everyone) for k in mine}  # the most loaded rank
    return dict(strategy=strategy, psi=psi, **worst)


def _warm_up(job: Dict[str, Any]) -> None:
    """One step of every strategy on a tiny GPT before anything is traced: what the first use
    allocates for good (imports, compiled kernels, cached plans) is not the model's."""
    import gc

    import numpy as np
    tiny = dict(job, layers=1, width=job["heads"] * 4)
    idx = np.zeros((1, job["block"]), dtype=np.int64)
    for strategy in job["strategies"]:
        model, optimizer, _ = setup.build(strategy, tiny, bucket_views=True)
        optimizer.zero_grad()
        model(idx, idx)[1].backward()
        optimizer.step()
        del model, optimizer
    gc.collect()


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    _warm_up(job)
    rows = []
    for strategy in job["strategies"]:
        rows.append(_measure(strategy, job))
        if dist.get_rank() == 0:
            r = rows[-1]
            print(f"{strategy} p={dist.get_world_size()}: at rest {r['at_rest'] / MiB:.1f} MiB "
                  f"(formula {formula(strategy, r['psi'], dist.get_world_size()) / MiB:.1f}), "
                  f"peak {r['peak'] / MiB:.1f} MiB", flush=True)
    return {"world_size": dist.get_world_size(), "rows": rows}


# ----- the driver ------------------------------------------------------------------------------
def _mib(nbytes: float) -> str:
    return f"{nbytes / MiB:.2f}"


def report(results: Sequence[dict], failures: Sequence[str], command: str, machine: str,
           job: Dict[str, Any]) -> str:
    lines = common.section_head(
        "Memory per rank: DDP and ZeRO-1/2/3 (`benchmarks/bench_memory.py`)", command, machine,
        f"GPT with {job['layers']} layers, width {job['width']}, {job['heads']} heads, vocabulary "
        f"{job['vocab']}, block {job['block']}, batch {job['batch']} per rank; float32, Adam; "
        "backend shm. Measured with tracemalloc from before the model is built, plus FSDP's "
        "memory-mapped full parameters; the most loaded rank. *At rest*: after two steps "
        "(gradients kept), after a warm-up step of each strategy on a tiny model; *peak*: during "
        "the third step (activations and gathered units included). Formula: DDP 16Ψ, ZeRO-1 8Ψ + 8Ψ/N, ZeRO-2 4Ψ + 12Ψ/N, ZeRO-3 16Ψ/N bytes. "
        "Goal: at rest within 10% of the formula.")
    body, misses = [], 0
    for result in results:
        n = result["world_size"]
        for r in result["rows"]:
            want = formula(r["strategy"], r["psi"], n)
            ratio = r["at_rest"] / want
            ok = abs(ratio - 1) <= 0.10
            misses += not ok
            body.append([r["strategy"], str(n), str(r["psi"]), _mib(want),
                         _mib(r["at_rest"]), f"{ratio:.3f}", common.verdict(ok),
                         _mib(r["params"]), _mib(r["grads"]), _mib(r["optimizer"]),
                         _mib(r["gathered"]), _mib(r["peak"])])
    lines += [f"Failed job: {f}" for f in failures]
    lines += [common.markdown_table(
        ["strategy", "N", "Ψ", "formula (MiB)", "at rest (MiB)", "ratio", "goal",
         "params (MiB)", "grads (MiB)", "optimizer (MiB)", "gathered (MiB)",
         "peak step (MiB)"], body, "lrrrrrlrrrrr"), ""]
    lines.append(f"Params, grads and optimizer: bytes of the arrays each holds, counted (a "
                 f"cross-check of the measured total). {misses} row(s) miss the goal.")
    return "\n".join(lines)


def chart(results: Sequence[dict], path: str) -> None:
    plt = common.pyplot()
    worlds = [r["world_size"] for r in results]
    fig, ax = plt.subplots(figsize=(7.5, 4))
    width = 0.8 / len(STRATEGIES)
    for i, strategy in enumerate(STRATEGIES):
        xs, measured, wanted = [], [], []
        for j, result in enumerate(results):
            for r in result["rows"]:
                if r["strategy"] == strategy:
                    xs.append(j + (i - 1.5) * width)
                    measured.append(r["at_rest"] / MiB)
                    wanted.append(formula(strategy, r["psi"], result["world_size"]) / MiB)
        ax.bar(xs, measured, width, label=strategy)
        ax.scatter(xs, wanted, color="black", marker="_", s=200, zorder=3)
    ax.set_xticks(range(len(worlds)), [f"N = {n}" for n in worlds])
    ax.set_ylabel("model states per rank (MiB)")
    ax.set_title("Measured (bars) and the ZeRO formula (black marks)")
    ax.legend()
    fig.tight_layout()
    common.save_figure(fig, path)


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="a tiny GPT, world sizes 1,2")
    parser.add_argument("--world-sizes", help="default 1,2,4 (quick: 1,2)")
    parser.add_argument("--layers", type=int, help="default 4 (quick: 2)")
    parser.add_argument("--width", type=int, help="default 256 (quick: 64)")
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--vocab", type=int, default=512)
    parser.add_argument("--block", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--job-timeout", type=float, default=900.0)
    parser.add_argument("--output", action="append", default=[])
    parser.add_argument("--chart", help="write the bar chart (PNG) here")
    args = parser.parse_args(argv)
    if args.worker:
        return args
    try:
        args.world_sizes = [int(p) for p in (args.world_sizes or
                                             ("1,2" if args.quick else "1,2,4")).split(",")]
    except ValueError:
        parser.error(f"cannot read --world-sizes {args.world_sizes!r}")
    args.layers = args.layers or (2 if args.quick else 4)
    args.width = args.width or (64 if args.quick else 256)
    if min(args.world_sizes + [args.layers, args.width, args.heads, args.batch]) < 1 \
            or args.width % args.heads:
        parser.error("sizes must be >= 1 and --width a multiple of --heads")
    return args


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    job = {"layers": args.layers, "width": args.width, "heads": args.heads, "vocab": args.vocab,
           "block": args.block, "batch": args.batch, "strategies": list(STRATEGIES)}
    results, failures = common.run_jobs(
        SCRIPT, [(f"shm, {p} ranks", "shm", p) for p in args.world_sizes], job, args.job_timeout)
    common.publish(report(results, failures, command, machine, job), args.output, SECTION)
    if args.chart and results:
        chart(results, args.chart)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_memory.py", parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
