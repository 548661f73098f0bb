"""Pipeline schedules: measured bubble and timelines of GPipe, 1F1B and interleaved 1F1B.

Each stage's forward and backward passes sleep a fixed time (backward twice forward, as in a
transformer) instead of computing: this machine has fewer cores than a pipeline has stages, so
real compute would measure the cores' sharing, not the schedule. The passes are ``p`` stages of
one Linear layer each (``v`` chunks per rank for the interleaved schedule) between sleeping
layers, trained on the shm backend; activations and gradients really move between processes.
The bubble is each stage's idle share of the step (``pipelining.bubble_fraction``), against
the textbook ``(p - 1) / (v*m + p - 1)`` for equal passes. One PNG per schedule shows the last
step's timeline.

    python benchmarks/bench_pipeline.py [--stages 4] [--microbatches 8] [--pass-ms 5]
        [--figures docs] [--output benchmarks/RESULTS.md]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from typing import Any, Dict, List, Optional, Sequence

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

SCRIPT = "benchmarks/bench_pipeline.py"
SECTION = "bench_pipeline"
SCHEDULES = (("gpipe", 1), ("1f1b", 1), ("interleaved", 2))


def _model(stages: int, forward_s: float):
    import numpy as np
    from neural_arch.nn import Linear, Module, Sequential

    class Sleepy(Module):
        """A pass of fixed length: ``forward_s`` forward, twice that backward."""

        def forward(self, x):
            time.sleep(forward_s)
            y = x * 1.0
            y.register_hook(lambda grad: time.sleep(2 * forward_s))
            return y

    layers: List[Any] = []
    for _ in range(stages):
        layers += [Linear(32, 32, dtype=np.float64), Sleepy()]
    model = Sequential(*layers)
    rng = np.random.default_rng(0)
    for p in model.parameters():
        p.data[...] = rng.standard_normal(p.data.shape) * 0.1
    return model


def worker(job: Dict[str, Any]) -> Dict[str, Any]:
    import numpy as np
    from neural_arch import distributed as dist
    from neural_arch import functional as F
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                    ScheduleInterleaved1F1B, bubble_fraction,
                                                    pipeline_split, plot_timeline)
    rank, p = dist.get_rank(), dist.get_world_size()
    kind, v, m = job["kind"], job["chunks"], job["microbatches"]
    n = p * v
    parts = pipeline_split(_model(n, job["pass_ms"] / 1e3 / v), n)
    stages = [PipelineStage(parts[i], i, n) for i in range(rank, n, p)]
    loss = F.mse_loss
    schedule = (ScheduleInterleaved1F1B(stages, m, loss) if kind == "interleaved" else
                (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(stages[0], m, loss))
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((4 * m, 32)), rng.standard_normal((4 * m, 32))
    bubbles = []
    for _ in range(job["steps"]):
        if rank == 0:
            schedule.step(x)
        elif rank == p - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
        events = schedule.timeline()
        bubbles.append(bubble_fraction(events))
    if rank == 0 and job.get("figure"):
        name = {"gpipe": "GPipe", "1f1b": "1F1B", "interleaved": f"interleaved 1F1B (v={v})"}
        plot_timeline(events, job["figure"],
                      title=f"{name[kind]}, p={p}, m={m}: bubble {bubbles[-1]:.0%}")
    return {"bubble": sorted(bubbles)[len(bubbles) // 2], "peak": schedule.peak_activations}


def parse_args(argv: Optional[Sequence[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--stages", type=int, default=4)
    parser.add_argument("--microbatches", type=int, default=8)
    parser.add_argument("--pass-ms", type=float, default=5.0,
                        help="forward time of one stage per micro-batch (backward: twice)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--figures", default=None, help="folder for the timeline PNGs")
    parser.add_argument("--output", action="append", default=[],
                        help="Markdown file(s) to write the section into")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    p, m = args.stages, args.microbatches
    rows, failures = [], []
    for kind, v in SCHEDULES:
        figure = (os.path.abspath(os.path.join(args.figures, f"pipeline_{kind}.png"))
                  if args.figures else None)
        job = dict(kind=kind, chunks=v, microbatches=m, pass_ms=args.pass_ms,
                   steps=args.steps, figure=figure)
        try:
            result = common.run_job(os.path.abspath(__file__), "shm", p, job, timeout=300)
        except common.JobFailed as exc:
            failures.append(str(exc))
            continue
        theory = (p - 1) / (v * m + p - 1)
        rows.append([kind if v == 1 else f"{kind} (v={v})", f"{result['bubble']:.1%}",
                     f"{theory:.1%}", result["peak"]])
        if figure:
            print(f"wrote {figure}")
    method = (f"{p} stages on the shm backend, {m} micro-batches; a stage's forward sleeps "
              f"{args.pass_ms:g} ms per micro-batch and its backward {2 * args.pass_ms:g} ms "
              "(interleaved: the same per rank, split over its chunks). Bubble: the median over "
              f"{args.steps} steps of the stages' mean idle share of the step. Peak: the most "
              "micro-batches of activations rank 0 held at once.")
    lines = common.section_head("Pipeline schedules: bubble", command, machine, method)
    lines.append(common.markdown_table(["schedule", "bubble (measured)",
                                        "(p-1)/(v*m+p-1)", "peak on rank 0"], rows))
    lines += [f"\nFAILED: {f}" for f in failures]
    common.publish("\n".join(lines), args.output, SECTION)
    return 1 if failures else 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    return common.entry_point(argv, SCRIPT, parse_args, worker, drive)


if __name__ == "__main__":
    sys.exit(main())
