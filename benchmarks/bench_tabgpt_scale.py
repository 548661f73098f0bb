"""TabGPT pretraining at scale: a generated table of 1,000,000 mixed-type rows, data parallel
(DDP) and ZeRO-2, through the launcher at p ranks.

The table is ``SyntheticTable`` (rows computed from their index, never stored: 8 numeric
columns with 5 % missing cells and 4 categorical ones). Each job runs on the shm backend, one
BLAS thread per rank; rank r reads rows ``(s x p + r) x B ...`` at step s (B rows per rank:
weak scaling), modulo the table. For each strategy, built and stepped as the ``Trainer`` does
(``strategy.training_step``): a fresh masked-cell pretraining TabGPT from the same seed, AdamW,
and the same masks on each rank (the generator seeded per rank), so that DDP and ZeRO-2 must
give the same losses, step by step. Reported per p and strategy: rows/s (all ranks' rows over
the slowest rank's time for the timed steps, batch generation included), the median step,
weak-scaling efficiency against p = 1 (rows/s over p x p = 1's), the peak traced memory of the
most loaded rank (tracemalloc from before the model is built through three steps, plus FSDP's
gathered parameters; a separate short run, so that tracing does not slow the timed one), the
ranks' mean loss over the first and last steps, and the largest difference from DDP's losses.
Below the table: ZeRO-2's median step over DDP's at each p, both measured in the same job
(goal: at most ``STEP_RATIO_GOAL``). With ``--rounds R`` each job runs the strategies R times,
every other round in the other order, and pools the timed steps of all rounds: on a shared
machine the ratio is then far steadier than the efficiencies, which compare separate jobs.

    python benchmarks/bench_tabgpt_scale.py [--nproc 1,2] [--rows 1000000] [--steps 40]
        [--warmup 3] [--batch 256] [--rounds 1] [--quick] [--output FILE]
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()  # before NumPy is imported

import argparse  # noqa: E402
import gc  # noqa: E402
import time  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

import bench_reporting as reporting  # noqa: E402

SECTION = "bench_tabgpt_scale"
SCRIPT = os.path.abspath(__file__)
STRATEGIES = ("ddp", "zero2")
EFFICIENCY_GOAL, LOSS_TOLERANCE = 0.90, 1e-5
STEP_RATIO_GOAL = 1.05  # ZeRO-2's median step over DDP's, the same p and job
# (d_token, layers, heads): the FT-Transformer's default size; a tiny one for smoke runs
MODEL, QUICK_MODEL = (192, 3, 8), (16, 1, 2)
MiB = float(1 << 20)


# ----- one rank ----------------------------------------------------------------------------------
def _parts(job: Dict[str, Any]):
    from neural_arch.data.tabular import SyntheticTable
    from neural_arch.models.tabgpt import TabGPTConfig
    table = SyntheticTable(rows=job["rows"], seed=0)
    d_token, layers, heads = job["model"]
    config = TabGPTConfig(**table.model_config(), d_token=d_token, n_layers=layers,
                          n_heads=heads)
    return table, config


def _build(name: str, config: Any) -> Any:
    from neural_arch.core import manual_seed
    from neural_arch.models.tabgpt import TabGPTForPreTraining
    from neural_arch.optim import AdamW
    from neural_arch.tabgpt.training.rows import TabularTrainingModule
    from neural_arch.training import TrainingConfig
    from neural_arch.training import strategies as S
    manual_seed(0)  # the same initial weights on every rank and for every strategy
    module = TabularTrainingModule(TabGPTForPreTraining(config))
    strategy = S.DataParallel() if name == "ddp" else S.FullyShardedDataParallel(stage=2)
    strategy.setup(module, AdamW(module.parameters(), lr=1e-3, weight_decay=1e-5),
                   TrainingConfig(progress_bar=False, verbose=False), None)
    strategy.train()
    return strategy


def _batch(table: Any, step: int, rank: int, world: int, batch: int):
    """Rank ``rank``'s rows of global step ``step``, packed as the Trainer's rows are."""
    start = (step * world + rank) * batch
    x_num, x_cat, y = table.rows_at(np.arange(start, start + batch) % len(table))
    return np.concatenate([x_num.astype(np.float64), x_cat.astype(np.float64)], axis=1), y


def _run(name: str, job: Dict[str, Any], steps: int, timed_from: int) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.core import manual_seed
    rank, world = dist.get_rank(), dist.get_world_size()
    table, config = _parts(job)
    strategy = _build(name, config)
    manual_seed(1000 + rank)  # masks and dropout: per rank, the same for every strategy
    losses, times = [], []
    dist.barrier()
    for step in range(steps):
        start = time.perf_counter()
        outcome = strategy.training_step(_batch(table, step, rank, world, job["batch"]), None)
        times.append(time.perf_counter() - start)
        losses.append(outcome.loss)
    params = sum(p.array.size for p in strategy.model.parameters())
    return dict(losses=losses, times=times[timed_from:], params=params)


def _peak_memory(name: str, job: Dict[str, Any]) -> int:
    """tracemalloc's peak from before the model is built through three steps (bytes), plus
    the full parameters FSDP gathers into memory maps that tracemalloc does not see."""
    import tracemalloc
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    try:
        from neural_arch import distributed as dist
        table, config = _parts(job)
        strategy = _build(name, config)
        module = strategy.wrapper.module
        if hasattr(module, "reset_peak_memory_stats"):
            module.reset_peak_memory_stats()
        for step in range(3):
            strategy.training_step(_batch(table, step, dist.get_rank(), dist.get_world_size(),
                                          job["batch"]), None)
        peak = tracemalloc.get_traced_memory()[1] - base
        if hasattr(module, "memory_stats"):
            peak += module.memory_stats().get("peak_gathered_bytes", 0)
    finally:
        tracemalloc.stop()
    return int(peak)


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    world, results, names = dist.get_world_size(), {}, job["strategies"]
    runs: Dict[str, List[Dict[str, Any]]] = {name: [] for name in names}
    for round_index in range(job.get("rounds", 1)):
        # every other round the other strategy goes first: neither always runs on a fresh
        # process or right after the other's memory traffic
        for name in names if round_index % 2 == 0 else names[::-1]:
            runs[name].append(_run(name, job, job["warmup"] + job["steps"], job["warmup"]))
            gc.collect()
    for name in names:
        times = [t for run in runs[name] for t in run["times"]]
        losses = np.array(runs[name][0]["losses"], dtype=np.float64)
        dist.all_reduce(losses)  # the ranks' mean loss, step by step
        elapsed = np.array([sum(times)])
        dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # the slowest rank sets the pace
        medians = np.array([float(np.median(times))])
        dist.all_reduce(medians, op=dist.ReduceOp.MAX)
        peak = np.array([_peak_memory(name, job)], dtype=np.float64)
        dist.all_reduce(peak, op=dist.ReduceOp.MAX)
        results[name] = dict(losses=(losses / world).tolist(), params=runs[name][0]["params"],
                             rows_per_s=world * job["batch"] * len(times) / elapsed[0],
                             step_ms=medians[0] * 1e3, peak_bytes=peak[0])
        gc.collect()
    return results


# ----- the driver --------------------------------------------------------------------------------
def summarize(results: Dict[int, Dict[str, Any]], window: int) -> List[dict]:
    rows = []
    for p in sorted(results):
        reference = results[p].get("ddp", {}).get("losses")
        for name, r in results[p].items():
            losses = r["losses"]
            base = results.get(1, {}).get(name)
            rows.append(dict(
                p=p, strategy=name, rows_per_s=r["rows_per_s"], step_ms=r["step_ms"],
                efficiency=None if base is None else r["rows_per_s"] / (p * base["rows_per_s"]),
                peak_mib=r["peak_bytes"] / MiB, params=r["params"],
                first=float(np.mean(losses[:window])), last=float(np.mean(losses[-window:])),
                vs_ddp=None if reference is None or name == "ddp" else float(np.max(np.abs(
                    np.array(losses) - np.array(reference))))))
    return rows


def step_ratios(rows: List[dict]) -> Dict[int, float]:
    """ZeRO-2's median step over DDP's, per p where both ran."""
    steps = {(r["p"], r["strategy"]): r["step_ms"] for r in rows}
    return {p: steps[(p, "zero2")] / steps[(p, "ddp")]
            for p in sorted({r["p"] for r in rows})
            if (p, "zero2") in steps and (p, "ddp") in steps and steps[(p, "ddp")] > 0}


def report(rows: List[dict], args: argparse.Namespace, command: str, machine: str) -> str:
    table, misses = [], []
    for r in rows:
        equal = r["vs_ddp"] is not None and r["vs_ddp"] <= LOSS_TOLERANCE * max(1.0, r["first"])
        decreased = r["last"] < r["first"]
        efficiency = "" if r["efficiency"] is None else f"{100 * r['efficiency']:.1f} %"
        if r["efficiency"] is not None and r["p"] > 1 and r["efficiency"] < EFFICIENCY_GOAL:
            misses.append(f"p = {r['p']} {r['strategy']}")
        table.append([r["p"], r["strategy"], f"{r['rows_per_s']:.0f}", f"{r['step_ms']:.1f}",
                      efficiency, f"{r['peak_mib']:.1f}", f"{r['first']:.4f}",
                      f"{r['last']:.4f}", reporting.verdict(decreased),
                      "" if r["vs_ddp"] is None else f"{r['vs_ddp']:.1e}",
                      "" if r["vs_ddp"] is None else reporting.verdict(equal)])
    d_token, layers, heads = QUICK_MODEL if args.quick else MODEL
    rounds = ("" if args.rounds == 1 else f" in each of {args.rounds} rounds (the strategies "
              f"alternating which goes first; steps pooled)")
    head = reporting.section_head(
        "TabGPT pretraining at scale (`benchmarks/bench_tabgpt_scale.py`)", command, machine,
        f"Masked-cell pretraining of TabGPT (d_token {d_token}, blocks {layers}, heads {heads}, "
        f"{rows[0]['params'] if rows else 0} parameters, AdamW) on a generated table "
        f"of {args.rows:,} rows (8 numeric, 4 categorical columns; rows computed from their "
        f"index), {args.batch} rows per rank per step (weak scaling), {args.steps} timed steps "
        f"after {args.warmup}{rounds}, backend shm, one thread per rank. Rows/s: all ranks' rows over "
        f"the slowest rank's time; efficiency: rows/s over p x p = 1's; peak: tracemalloc, the "
        f"most loaded rank; losses: the ranks' mean over the first and last {args.window} "
        f"steps; loss - DDP: the largest difference from DDP's loss at any step.")
    body = reporting.markdown_table(
        ["p", "strategy", "rows/s", "step ms", "efficiency", "peak MiB / rank", "first loss",
         "last loss", "decreased", "max abs loss - DDP", "equal"], table, "llrrrrrrlrl")
    goal = (f"goal: weak-scaling efficiency >= {100 * EFFICIENCY_GOAL:.0f} % at every p > 1; "
            + (f"missed by {', '.join(misses)}." if misses else "met."))
    ratios = step_ratios(rows)
    lines = [body, "", goal]
    if ratios:
        lines.append("ZeRO-2 / DDP median step (same job): " + ", ".join(
            f"p = {p}: {ratio:.3f}" for p, ratio in ratios.items())
            + f"; goal <= {STEP_RATIO_GOAL:.2f}.")
    return "\n".join(head + lines)


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nproc", default="1,2", help="world sizes, e.g. 1,2 or 1,2,4,8")
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="rows per rank per step")
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of both strategies per job, alternating their order")
    parser.add_argument("--window", type=int, default=5, help="steps averaged for the losses")
    parser.add_argument("--quick", action="store_true", help="a tiny TabGPT (a smoke run)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds per job")
    parser.add_argument("--output", action="append", default=[])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    try:
        world_sizes = sorted({int(p) for p in args.nproc.split(",") if p.strip()})
    except ValueError:
        raise SystemExit(f"--nproc takes world sizes like 1,2 or 2, got {args.nproc!r}")
    if not world_sizes or world_sizes[0] < 1:
        raise SystemExit(f"--nproc needs world sizes of 1 or more, got {args.nproc!r}")
    if (args.rows < 1 or args.steps < 1 or args.batch < 1 or args.rounds < 1
            or args.warmup < 0):
        raise SystemExit("--rows, --steps, --batch and --rounds must be >= 1, --warmup >= 0")
    args.window = max(1, min(args.window, (args.warmup + args.steps) // 2))
    job = dict(rows=args.rows, steps=args.steps, warmup=args.warmup, batch=args.batch,
               rounds=args.rounds,
               model=list(QUICK_MODEL if args.quick else MODEL), strategies=list(STRATEGIES))
    results = {}
    for p in world_sizes:
        print(f"== p = {p}", flush=True)
        results[p] = common.run_job(SCRIPT, "shm", p, job, timeout=args.timeout)
    rows = summarize(results, args.window)
    reporting.publish(report(rows, args, command, machine), args.output, SECTION)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_tabgpt_scale.py", parse_args, worker,
                              drive)


if __name__ == "__main__":
    sys.exit(main())
