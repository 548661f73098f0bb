"""Pipeline schedules: ``ScheduleGPipe``, ``Schedule1F1B``, ``ScheduleInterleaved1F1B``.

As in PyTorch: every stage builds the same schedule and calls ``step`` once per batch; the
first stage passes the batch (``step(x)``), the last the target and a list that receives one
loss per micro-batch (``step(target=y, losses=losses)``), middle stages nothing, a single stage
all of it. The batch is cut into ``n_microbatches`` equal slices along dim 0. ``loss_fn`` gives
a micro-batch's mean loss and each micro-batch's backward is scaled by ``1/n_microbatches``, so
the gradients are those of the mean loss over the whole batch; they accumulate into the
parameters' ``.grad`` (zero them before ``step`` as usual) and the caller then steps its
optimizer on its own stage's parameters.

``step`` first checks, with one small all-gather over the pipeline group, that every stage runs
the same schedule with the same number of micro-batches: a mismatch is a ValueError on every
stage naming each stage's values, not a hang. Then it runs this rank's steps of the shared
plan (``plan``): its batches of messages (``transfer``) and its passes.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List, Optional, Sequence

import numpy as np

from ...core import Tensor
from .. import collectives
from .failures import before_the_error_leaves
from .plan import Plan, build_plan
from .stage import PipelineStage, start_tied_equal, sync_tied
from .timeline import Event, gather_events
from .transfer import exchange

_KIND_CODES = {"gpipe": 1, "1f1b": 2, "interleaved": 3}
_NAMES = {1: "ScheduleGPipe", 2: "Schedule1F1B", 3: "ScheduleInterleaved1F1B"}


def split_microbatches(value: Any, n: int, what: str) -> List[Any]:
    """``value`` cut into ``n`` equal slices along dim 0 (Tensors stay Tensors)."""
    data = value.array if isinstance(value, Tensor) else np.asarray(value)
    if data.ndim == 0:
        raise ValueError(f"{what} must have a batch dimension to split into {n} micro-batches, "
                         "got a scalar")
    if data.shape[0] % n:
        raise ValueError(f"{what} has batch size {data.shape[0]} (shape {data.shape}), which "
                         f"does not split into {n} equal micro-batches")
    size = data.shape[0] // n
    parts = [data[i * size:(i + 1) * size] for i in range(n)]
    if isinstance(value, Tensor):
        return [Tensor(part) for part in parts]
    return parts


class PipelineSchedule:
    """What the three schedules share; ``kind`` picks the order of passes (``plan``)."""

    kind = ""

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int,
                 loss_fn: Optional[Callable] = None) -> None:
        if isinstance(n_microbatches, bool) or not isinstance(n_microbatches, (int, np.integer)):
            raise TypeError(f"n_microbatches must be an int, got {n_microbatches!r}")
        if n_microbatches < 1:
            raise ValueError(f"n_microbatches must be at least 1, got {n_microbatches}")
        if loss_fn is not None and not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable, got {type(loss_fn).__name__}")
        stages = list(stages)
        for stage in stages:
            if not isinstance(stage, PipelineStage):
                raise TypeError(f"{type(self).__name__} needs PipelineStage objects, got "
                                f"{type(stage).__name__}")
        self.n_microbatches, self.loss_fn = int(n_microbatches), loss_fn
        self.group = stages[0].group
        self.p = self.group.size
        self.v = stages[0].num_stages // self.p
        want = [self.group.rank + c * self.p for c in range(self.v)]
        got = sorted(stage.stage_index for stage in stages)
        if got != want or any(s.num_stages != stages[0].num_stages or s.group is not self.group
                              for s in stages):
            raise ValueError(f"{type(self).__name__} on group rank {self.group.rank} of "
                             f"{self.p} needs stages {want} of {stages[0].num_stages} (same "
                             f"group), got stages {got}")
        self._by_chunk = sorted(stages, key=lambda s: s.stage_index)
        self._plan: Optional[Plan] = None
        self._events: List[Event] = []
        self.peak_activations = 0  # micro-batches of activations held at once, last step

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = build_plan(self.kind, self.p, self.n_microbatches, self.v)
        return self._plan

    def _check_agreement(self) -> None:
        """Every stage runs the same schedule on the same number of micro-batches."""
        if self.p == 1:
            return
        mine = np.array([self.n_microbatches, _KIND_CODES[self.kind], self.v], np.int64)
        rows = collectives.all_gather(mine, group=self.group)
        if all(np.array_equal(row, mine) for row in rows):
            return
        described = "; ".join(
            f"stage {r} (rank {self.group.ranks[r]}): {_NAMES.get(int(row[1]), '?')} with "
            f"n_microbatches={int(row[0])}, {int(row[2])} stage(s) per rank"
            for r, row in enumerate(rows))
        raise ValueError(f"pipeline stages disagree on the schedule: {described}")

    def step(self, *args: Any, target: Any = None, losses: Optional[list] = None) -> None:
        """Run one batch through the pipeline (forward and backward of every micro-batch).

        Returns None; on the last stage ``losses`` receives each micro-batch's loss (a
        one-element Tensor, detached from the graph), in micro-batch order."""
        self._check_agreement()
        first, last = self._by_chunk[0].is_first, self._by_chunk[-1].is_last
        m, stage0 = self.n_microbatches, self._by_chunk[0]
        if first and not args:
            raise ValueError(f"stage {stage0.stage_index} is the first pipeline stage: call "
                             "step(x) with the batch")
        if args and not first:
            raise ValueError(f"stage {stage0.stage_index} is not the first pipeline stage and "
                             f"takes no input; got {len(args)} positional argument(s)")
        if len(args) > 1:
            raise ValueError(f"step takes one batch (the first stage's input), got {len(args)}")
        if last and target is None:
            raise ValueError(f"stage {self._by_chunk[-1].stage_index} is the last pipeline "
                             "stage: call step(..., target=y, losses=losses)")
        if target is not None and not last:
            raise ValueError(f"stage {stage0.stage_index} is not the last pipeline stage and "
                             "takes no target")
        inputs = split_microbatches(args[0], m, "the batch") if first else None
        targets = split_microbatches(target, m, "the target") if last else None
        if losses is not None and not isinstance(losses, list):
            raise TypeError(f"losses must be a list, got {type(losses).__name__}")
        for stage in self._by_chunk:
            stage.clear()
        start_tied_equal(self._by_chunk)
        self._run(inputs, targets, losses)
        sync_tied(self._by_chunk, gradients=True)

    def _run(self, inputs, targets, losses) -> None:
        p, m = self.p, self.n_microbatches
        rank = self.group.rank
        last_stage = p * self.v - 1
        inbox: Dict[tuple, np.ndarray] = {}  # (kind, virtual stage, mb) -> array
        outgoing: Dict[tuple, np.ndarray] = {}
        grad_meta: Dict[tuple, tuple] = {}
        self._events, self.peak_activations = [], 0
        backwards = [0] * len(self._by_chunk)  # backward passes run per chunk, this step
        for step in self.plan.steps[rank]:
            for sends, recvs in step.batches:
                try:
                    inbox.update(exchange(self.group, sends, recvs, outgoing, grad_meta))
                except Exception as exc:
                    peers = sorted({m.dst for m in sends} | {m.src for m in recvs})
                    exc.add_note(f"while pipeline rank {self.group.global_rank} exchanged "
                                 f"activations/gradients with pipeline rank(s) {peers} (tick "
                                 f"{step.tick} of the {self.kind} schedule)")
                    before_the_error_leaves(self.group.global_rank, exc)
                    raise
            action = step.action
            if action is None:
                continue
            stage = self._by_chunk[action.chunk]
            index = stage.stage_index
            produced = None  # the key of what this pass hands on, if anything
            start = time.perf_counter()
            try:
                if action.kind == "F":
                    value = inputs[action.mb] if index == 0 else inbox.pop(
                        ("act", index, action.mb))
                    target = targets[action.mb] if index == last_stage else None
                    out = stage.forward_one(action.mb, value, self.loss_fn, target, losses)
                    if index < last_stage:
                        produced = ("act", index + 1, action.mb)
                        grad_meta[("grad", index, action.mb)] = stage.output_meta(action.mb)
                else:
                    grad = None if index == last_stage else inbox.pop(
                        ("grad", index, action.mb))
                    backwards[action.chunk] += 1
                    out = stage.backward_one(action.mb, grad, 1.0 / m,
                                             last=backwards[action.chunk] == m)
                    produced = None if index == 0 else ("grad", index - 1, action.mb)
            except Exception as exc:
                where = (f"in pipeline stage {index} (rank {self.group.global_rank}), "
                         f"{'forward' if action.kind == 'F' else 'backward'} of micro-batch "
                         f"{action.mb}")
                exc.add_note(where)
                before_the_error_leaves(self.group.global_rank, exc, where)
                raise
            self._events.append(Event(rank, action.kind, action.mb, action.chunk, start,
                                      time.perf_counter()))
            self.peak_activations = max(self.peak_activations,
                                        sum(s.in_flight for s in self._by_chunk))
            if produced is not None:
                arr = np.asarray(out.array if isinstance(out, Tensor) else out)
                if produced[1] % p == rank:  # the consumer is on this rank too
                    inbox[produced] = arr
                else:
                    outgoing[produced] = arr

    def timeline(self, gather: bool = True) -> List[Event]:
        """The passes of the last ``step`` with their start and end times (``time.perf_counter``
        seconds: one clock for every process of a machine). With ``gather`` (collective: every
        stage must call it) all stages' events, on every stage; else this rank's."""
        if not gather or self.p == 1:
            return list(self._events)
        return gather_events(self._events, self.group)


class ScheduleGPipe(PipelineSchedule):
    """Every micro-batch's forward, then every backward (holds all ``m`` micro-batches)."""

    kind = "gpipe"

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Optional[Callable] = None) -> None:
        _one_stage_per_rank(stage, type(self).__name__)
        super().__init__([stage], n_microbatches, loss_fn)


class Schedule1F1B(PipelineSchedule):
    """Warm-up forwards, then one forward and one backward in turn, then the last backwards:
    stage ``s`` of ``p`` holds at most ``p - s`` micro-batches of activations."""

    kind = "1f1b"

    def __init__(self, stage: PipelineStage, n_microbatches: int,
                 loss_fn: Optional[Callable] = None) -> None:
        _one_stage_per_rank(stage, type(self).__name__)
        super().__init__([stage], n_microbatches, loss_fn)


class ScheduleInterleaved1F1B(PipelineSchedule):
    """Megatron-LM's interleaved 1F1B: rank ``r`` of ``p`` holds model chunks ``r, r + p,
    ...``. A smaller bubble for more messages. Any ``n_microbatches`` works: micro-batches go
    through the chunks in rounds of ``p`` when ``p`` divides it (Megatron-LM's rule), else in
    ``max(1, m // p)`` rounds of nearly equal size (``plan.interleaved_rounds``)."""

    kind = "interleaved"

    def __init__(self, stages: Sequence[PipelineStage], n_microbatches: int,
                 loss_fn: Optional[Callable] = None) -> None:
        if isinstance(stages, PipelineStage):
            stages = [stages]
        stages = list(stages)
        if not stages:
            raise ValueError("ScheduleInterleaved1F1B needs this rank's stages, got none")
        super().__init__(stages, n_microbatches, loss_fn)


def _one_stage_per_rank(stage: Any, name: str) -> None:
    if not isinstance(stage, PipelineStage):
        raise TypeError(f"{name} needs one PipelineStage, got {type(stage).__name__} (use "
                        "ScheduleInterleaved1F1B for several stages per rank)")
    if stage.num_stages != stage.group.size:
        raise ValueError(f"{name} runs one stage per rank: num_stages {stage.num_stages} must "
                         f"equal the pipeline group's size {stage.group.size}")
