"""The ranks' side of ``bench_model_parallel.py``: one function per kind of job (the bubble of
each schedule, a training step's time, the activations held per stage), each run on every
rank of a job the driver starts; rank 0's return value is the job's result.
"""
from __future__ import annotations

import time
import tracemalloc
from typing import Any, Dict, List

import numpy as np

FORWARD_S = 0.040  # a stage's forward wait per micro-batch in the bubble jobs; backward twice
SCHEDULES = ("gpipe", "1f1b", "interleaved")


def formula(schedule: str, p: int, m: int) -> float:
    """The bubble with equal passes: (p - 1)/(m + p - 1); interleaved (v = 2)
    (p - 1)/(v m + p - 1) for m >= p, and for m < p, where each micro-batch crosses the p v
    virtual stages one after another, 1 - v m/(m + p v - 1) (``plan.interleaved_bubble``)."""
    if schedule == "interleaved":
        from neural_arch.distributed.pipelining.plan import interleaved_bubble
        return interleaved_bubble(p, m, 2)
    return (p - 1) / (m + p - 1)


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
            return make_result(y.array, (y,), backward)
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
        layers = [_timed_layer(job.get("forward_s", FORWARD_S) / v) for _ in range(p * v)]
        pieces = pp.pipeline_split(Sequential(*layers), p * v)
        stages = [pp.PipelineStage(pieces[rank + c * p], rank + c * p, p * v)
                  for c in range(v)]
        for m in job["ms"]:  # every count, p dividing it or not
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
    model = GPT(GPTConfig(**size))
    if tp_group is None:
        return model
    from neural_arch.distributed.tensor_parallel import parallelize_gpt
    return parallelize_gpt(model, tp_group)


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
