"""Model parallelism on this machine: the pipeline bubble of each schedule against its formula,
tensor- and pipeline-parallel step time against one process, and the activations each stage
holds under GPipe and 1F1B.

- Bubble: the idle fraction of a step (``bubble_fraction`` of the schedule's measured timeline)
  for p = 2 and 4 stages and m = 1..16 micro-batches, against (p - 1)/(m + p - 1), and
  (p - 1)/(v*m + p - 1) for the interleaved schedule with v = 2 chunks per rank. Each stage's
  work is a fixed wait (40 ms forward, 80 ms backward per micro-batch and rank; a chunk of the
  interleaved schedule half of it), so that four stages on two cores do not share cores and
  the schedule alone decides the idle time; the messages between stages are real.
- Speed: a GPT (n_embd 512) trained one step at a time, one process against tensor parallel
  at tp = 2 and a 1F1B pipeline at pp = 2 with m = 8; one BLAS thread per process, so that the
  parallel runs use two cores where the single process uses one.
- Activations: each stage's tracemalloc'd memory right after every forward, over a step, in
  units of one micro-batch's activations measured the same way: GPipe holds all m, 1F1B at
  most p (stage 0), fewer further down.

    python benchmarks/bench_model_parallel.py [--quick] [--output benchmarks/RESULTS.md]
        [--pictures docs]
"""
from __future__ import annotations

import os
import sys

sys.path[:0] = [os.path.dirname(os.path.abspath(__file__)),
                os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]

import bench_common as common  # noqa: E402

common.one_thread_per_rank()

import argparse  # noqa: E402
import time  # noqa: E402
import tracemalloc  # noqa: E402
from typing import Any, Dict, List, Optional  # noqa: E402

import numpy as np  # noqa: E402

SECTION = "bench_model_parallel"
SCRIPT = os.path.abspath(__file__)
BUBBLE_GOAL_POINTS, TP_GOAL, PP_GOAL, MEMORY_GOAL = 5.0, 1.6, 1.5, "p"
FORWARD_S = 0.040
SCHEDULES = ("gpipe", "1f1b", "interleaved")
FULL = dict(ps=(2, 4), ms=(1, 2, 4, 8, 16), steps=3,
            gpt=dict(n_layer=4, n_embd=512, n_head=8, block_size=64, vocab_size=1024),
            batch=16, pp_m=8, speed_steps=5,
            memory_gpt=dict(n_layer=4, n_embd=128, n_head=4, block_size=64, vocab_size=256),
            memory_batch=16, memory_m=8)
QUICK = dict(ps=(2,), ms=(1, 2, 4), steps=1,
             gpt=dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64),
             batch=4, pp_m=2, speed_steps=1,
             memory_gpt=dict(n_layer=2, n_embd=32, n_head=2, block_size=16, vocab_size=64),
             memory_batch=4, memory_m=4)


def formula(schedule: str, p: int, m: int) -> float:
    v = 2 if schedule == "interleaved" else 1
    return (p - 1) / (v * m + p - 1)


def micro_batch_counts(schedule: str, p: int, ms) -> List[int]:
    # the interleaved schedule sends micro-batches through in groups of p
    return [m for m in ms if schedule != "interleaved" or m % p == 0]


# ----- the ranks' side ---------------------------------------------------------------------
def _timed_layer(forward_s: float):
    from neural_arch.core.tensor import make_result
    from neural_arch.nn import Module, Parameter

    class TimedLayer(Module):
        """y = x * w after ``forward_s`` of waiting; its backward waits twice as long."""

        def __init__(self) -> None:
            super().__init__()
            self.weight = Parameter(np.ones(4))

        def forward(self, x):
            time.sleep(forward_s)
            y = x * self.weight

            def backward(grad):
                time.sleep(2 * forward_s)
                return (grad,)
            return make_result(y.data, (y,), backward)
    return TimedLayer()


def _schedule(name: str, stages, m: int, loss_fn):
    from neural_arch.distributed import pipelining as pp
    if name == "interleaved":
        return pp.ScheduleInterleaved1F1B(stages, m, loss_fn)
    cls = pp.ScheduleGPipe if name == "gpipe" else pp.Schedule1F1B
    return cls(stages[0], m, loss_fn)


def _run_step(schedule, stage_index: int, last: bool, x, y) -> List[Any]:
    losses: List[Any] = []
    if stage_index == 0 and last:
        schedule.step(x, target=y, losses=losses)
    elif stage_index == 0:
        schedule.step(x)
    elif last:
        schedule.step(target=y, losses=losses)
    else:
        schedule.step()
    return losses


def _mse(out, target):
    diff = out - target
    return (diff * diff).mean()


def bubble_job(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.distributed import pipelining as pp
    from neural_arch.nn import Sequential
    rank, p = dist.get_rank(), dist.get_world_size()
    rows, timelines = [], {}
    for name in SCHEDULES:
        v = 2 if name == "interleaved" else 1
        layers = [_timed_layer(FORWARD_S / v) for _ in range(p * v)]
        pieces = pp.pipeline_split(Sequential(*layers), p * v)
        stages = [pp.PipelineStage(pieces[rank + c * p], rank + c * p, p * v)
                  for c in range(v)]
        for m in micro_batch_counts(name, p, job["ms"]):
            schedule = _schedule(name, stages, m, _mse)
            x, y = np.ones((m, 4)), np.zeros((m, 4))
            measured = []
            for _ in range(job["steps"] + 1):  # the first step also sends the shape headers
                _run_step(schedule, rank, rank == p - 1, x, y)
                events = schedule.timeline()
                measured.append(pp.bubble_fraction(events))
            rows.append(dict(schedule=name, p=p, m=m, measured=float(np.median(measured[1:])),
                             formula=formula(name, p, m)))
            if m == job["picture_m"]:
                timelines[name] = [tuple(e) for e in events]
    return dict(rows=rows, timelines=timelines)


def _gpt(size: Dict[str, int], tp_group=None):
    from neural_arch.core import manual_seed
    from neural_arch.models import GPT, GPTConfig
    manual_seed(0)
    return GPT(GPTConfig(**size), tp_group=tp_group)


def _batch(size: Dict[str, int], batch: int):
    rng = np.random.default_rng(1)
    shape = (batch, size["block_size"])
    return rng.integers(0, size["vocab_size"], shape), rng.integers(0, size["vocab_size"], shape)


def _median_ms(step, steps: int) -> float:
    from neural_arch import distributed as dist
    step()  # warm-up: optimizer state, shape headers
    times = []
    for _ in range(steps):
        dist.barrier()
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    slowest = np.array([float(np.median(times))])
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest[0]) * 1e3


def speed_job(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch.distributed import pipelining as pp
    from neural_arch.optim import SGD
    rank, world = dist.get_rank(), dist.get_world_size()
    size, idx_y = job["gpt"], _batch(job["gpt"], job["batch"])
    idx, y = idx_y
    if job["mode"] in ("dense", "tp"):
        model = _gpt(size, dist.new_group() if job["mode"] == "tp" else None)
        opt = SGD(model.parameters(), lr=1e-3)

        def step():
            opt.zero_grad()
            _, loss = model(idx, y)
            loss.backward()
            opt.step()
        return dict(mode=job["mode"], world=world, ms=_median_ms(step, job["steps"]))
    model = _gpt(size)
    piece = pp.pipeline_split(model, world)[rank]
    stage = pp.PipelineStage(piece, rank, world)
    opt = SGD(piece.parameters(), lr=1e-3)
    vocab = size["vocab_size"]

    def loss_fn(logits, target):
        from neural_arch import functional as F
        return F.cross_entropy(logits.reshape(-1, vocab), np.asarray(target).reshape(-1))
    schedule = pp.Schedule1F1B(stage, job["m"], loss_fn)

    def step():
        opt.zero_grad()
        _run_step(schedule, rank, rank == world - 1, idx, y)
        opt.step()
    return dict(mode="pp", world=world, m=job["m"], ms=_median_ms(step, job["steps"]))


def memory_job(job: Dict[str, Any]) -> Dict[str, Any]:
    from neural_arch import distributed as dist
    from neural_arch import functional as F
    from neural_arch.distributed import pipelining as pp
    rank, p = dist.get_rank(), dist.get_world_size()
    size, m = job["gpt"], job["m"]
    idx, y = _batch(size, job["batch"])
    piece = pp.pipeline_split(_gpt(size), p)[rank]
    vocab = size["vocab_size"]

    def loss_fn(logits, target):
        return F.cross_entropy(logits.reshape(-1, vocab), np.asarray(target).reshape(-1))
    # One micro-batch's activations on this stage: memory held right after its forward. The
    # input of a later stage is a float array of the first stage's output shape.
    mb = job["batch"] // m
    first_input = idx[:mb]
    width = (mb, size["block_size"], size["n_embd"])
    sample = first_input if rank == 0 else np.zeros(width, np.float32)
    from neural_arch.core import Tensor

    def one_forward():
        return piece(sample if rank == 0 else Tensor(sample, requires_grad=True))
    one_forward()  # first calls allocate once (kernels, caches): not activations
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    held_output = one_forward()
    one = tracemalloc.get_traced_memory()[0] - before
    del held_output
    tracemalloc.stop()
    results = {}
    for name in ("gpipe", "1f1b"):
        stage = pp.PipelineStage(piece, rank, p)
        schedule = _schedule(name, [stage], m, loss_fn)
        _run_step(schedule, rank, rank == p - 1, idx, y)  # gradients and headers exist
        marks: List[int] = []
        original = piece.forward

        def forward_and_mark(x):
            out = original(x)
            marks.append(tracemalloc.get_traced_memory()[0])
            return out
        piece.forward = forward_and_mark  # an instance attribute: this piece only
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        _run_step(schedule, rank, rank == p - 1, idx, y)
        peak = tracemalloc.get_traced_memory()[1] - base
        tracemalloc.stop()
        del piece.forward
        if len(marks) != m:
            raise RuntimeError(f"counted {len(marks)} forwards of stage {rank}, expected {m}")
        results[name] = dict(held=(max(marks) - base) / one, peak_mib=peak / 2**20)
    rows = dist.all_gather_object(dict(rank=rank, one_mib=one / 2**20, **results))
    return dict(p=p, m=m, stages=rows)


def worker(job: Dict[str, Any]) -> Any:
    return {"bubble": bubble_job, "speed": speed_job, "memory": memory_job}[job["kind"]](job)


# ----- the driver's side -------------------------------------------------------------------
def bubble_table(rows: List[dict]) -> tuple:
    table, misses = [], 0
    for r in rows:
        points = abs(r["measured"] - r["formula"]) * 100
        ok = points <= BUBBLE_GOAL_POINTS
        misses += not ok
        table.append([r["schedule"], r["p"], r["m"], f"{r['formula']:.3f}",
                      f"{r['measured']:.3f}", f"{points:.1f}", common.verdict(ok)])
    text = common.markdown_table(["schedule", "p", "m", "formula", "measured", "points off",
                                  f"within {BUBBLE_GOAL_POINTS:.0f} points"], table,
                                 "lrrrrrl")
    return text, misses


def speed_table(results: Dict[str, dict]) -> tuple:
    dense = results["dense"]["ms"]
    rows, misses = [], 0
    for key, goal in (("dense", None), ("tp", TP_GOAL), ("pp", PP_GOAL)):
        r = results[key]
        speedup = dense / r["ms"]
        ok = None if goal is None else speedup >= goal
        misses += ok is False
        what = {"dense": "one process", "tp": "tensor parallel, tp = 2",
                "pp": f"1F1B pipeline, pp = 2, m = {r.get('m')}"}[key]
        rows.append([what, r["world"], f"{r['ms']:.1f}", f"{speedup:.2f}",
                     "" if goal is None else f">= {goal}", common.verdict(ok) if goal else ""])
    return common.markdown_table(["run", "processes", "step ms", "speedup", "goal", "verdict"],
                                 rows, "lrrrrl"), misses


def memory_table(result: dict) -> tuple:
    p, rows, misses = result["p"], [], 0
    for row in sorted(result["stages"], key=lambda r: r["rank"]):
        ok = row["1f1b"]["held"] <= p + 0.05  # a micro-batch's own temporaries aside
        misses += not ok
        rows.append([row["rank"], f"{row['one_mib']:.2f}", f"{row['gpipe']['held']:.2f}",
                     f"{row['1f1b']['held']:.2f}", f"{row['gpipe']['peak_mib']:.1f}",
                     f"{row['1f1b']['peak_mib']:.1f}", common.verdict(ok)])
    return common.markdown_table(
        ["stage", "one micro-batch MiB", "GPipe held (micro-batches)",
         "1F1B held (micro-batches)", "GPipe peak MiB", "1F1B peak MiB", f"1F1B <= p = {p}"],
        rows, "rrrrrrl"), misses


def draw(timelines: Dict[str, list], p: int, m: int, directory: str) -> List[str]:
    """One picture per schedule (and the 1F1B trace) of the p-stage, m-micro-batch step."""
    from neural_arch.distributed.pipelining import (Event, bubble_fraction, plot_timeline,
                                                    write_chrome_trace)
    os.makedirs(directory, exist_ok=True)
    paths = []
    for name, rows in timelines.items():
        events = [Event(*row) for row in rows]
        base = os.path.join(directory, f"pipeline_{name}")
        title = (f"{name}: p = {p}, m = {m}; measured bubble {bubble_fraction(events):.0%}, "
                 f"formula {formula(name, p, m):.0%}")
        paths.append(plot_timeline(events, base + ".png", title))
        if name == "1f1b":
            paths.append(write_chrome_trace(events, base + "_trace.json"))
    return paths


def parse_args(argv: Optional[List[str]]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--backend", default="shm", choices=common.BACKENDS)
    parser.add_argument("--output", action="append", default=[],
                        help="write or update this script's section of this Markdown file")
    parser.add_argument("--pictures", default=None,
                        help="folder for the schedule pictures and the 1F1B trace")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def drive(args: argparse.Namespace, command: str, machine: str) -> int:
    size = QUICK if args.quick else FULL
    picture_p, picture_m = size["ps"][-1], size["ms"][-1] if args.quick else 8
    bubble_rows, timelines = [], {}
    for p in size["ps"]:
        result = common.run_job(SCRIPT, args.backend, p, dict(
            kind="bubble", ms=list(size["ms"]), steps=size["steps"],
            picture_m=picture_m if p == picture_p else -1), args.timeout)
        bubble_rows += result["rows"]
        timelines.update(result["timelines"] if p == picture_p else {})
    speed = {}
    for mode, world in (("dense", 1), ("tp", 2), ("pp", 2)):
        speed[mode] = common.run_job(SCRIPT, args.backend, world, dict(
            kind="speed", mode=mode, gpt=size["gpt"], batch=size["batch"], m=size["pp_m"],
            steps=size["speed_steps"]), args.timeout)
    memory = common.run_job(SCRIPT, args.backend, 2, dict(
        kind="memory", gpt=size["memory_gpt"], batch=size["memory_batch"],
        m=size["memory_m"]), args.timeout)
    bubble_text, bubble_misses = bubble_table(bubble_rows)
    speed_text, speed_misses = speed_table(speed)
    memory_text, memory_misses = memory_table(memory)
    pictures = draw(timelines, picture_p, picture_m, args.pictures) if args.pictures else []
    gpt = size["gpt"]
    head = common.section_head(
        "Model parallelism (`benchmarks/bench_model_parallel.py`)", command, machine,
        f"Backend {args.backend}. Bubble: idle fraction of the measured timeline (median of "
        f"{size['steps']} steps after a first), stage work a fixed wait of "
        f"{FORWARD_S * 1e3:.0f} ms forward and {2 * FORWARD_S * 1e3:.0f} ms backward per "
        "micro-batch and rank (halved per chunk for the interleaved schedule, v = 2), so "
        "that p stages never share a core; formula (p-1)/(v m + p - 1). Speed: GPT "
        f"{gpt['n_layer']} x {gpt['n_embd']} (heads {gpt['n_head']}, T {gpt['block_size']}, "
        f"vocab {gpt['vocab_size']}), batch {size['batch']}, float32, SGD; the slowest rank's "
        f"median of {size['speed_steps']} steps after one; one thread per process. "
        "Activations: tracemalloc'd memory after each forward of a step, above the memory "
        "before it, in units of one micro-batch's (GPT "
        f"{size['memory_gpt']['n_layer']} x {size['memory_gpt']['n_embd']}, batch "
        f"{size['memory_batch']}, m = {size['memory_m']}, p = {memory['p']}).")
    misses = bubble_misses + speed_misses + memory_misses
    body = head + ["### Pipeline bubble", "", bubble_text, "", "### Step time", "", speed_text,
                   "", "### Activations held per stage", "", memory_text, "",
                   f"{misses} row(s) miss their goal."]
    if pictures:
        body += ["", "Pictures: " + ", ".join(f"`{os.path.relpath(p, common.ROOT)}`"
                                              for p in pictures)]
    common.publish("\n".join(body), args.output, SECTION)
    return 0


def main(argv: Optional[List[str]] = None) -> int:
    return common.entry_point(argv, "benchmarks/bench_model_parallel.py", parse_args, worker,
                              drive)


if __name__ == "__main__":
    sys.exit(main())
