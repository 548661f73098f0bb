"""``Pipe([part1, part2, ...], chunks=m)``: the one-line spelling of a pipeline.

Every rank builds the same ``Pipe`` from the same list of parts; each rank keeps its own parts
(part ``i`` runs on pipeline rank ``i % p``), wraps them in ``PipelineStage``s and runs a
schedule over ``chunks`` micro-batches: 1F1B (or GPipe, ``schedule="gpipe"``) with one part per
rank, the interleaved schedule with several. ``pipe.parameters()`` are this rank's parts'
parameters, for its optimizer; ``pipe.step(...)`` (or ``pipe(...)``) takes the same arguments
as a schedule's ``step``. A ``Sequential`` or GPT instead of a list is first cut with
``pipeline_split`` into one part per rank.
"""
from __future__ import annotations

from typing import Any, Callable, List, Optional

from ...nn import Module, ModuleList
from ..group.world import ProcessGroup, resolve_group
from .schedules import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from .split import pipeline_split
from .stage import PipelineStage
from .timeline import Event

_SCHEDULES = ("1f1b", "gpipe")


class Pipe(Module):
    """A model cut into parts, this rank's parts run as pipeline stages (see the module
    docstring). ``loss_fn(output, target)`` is needed on the rank holding the last part."""

    def __init__(self, parts: Any, chunks: int = 1, loss_fn: Optional[Callable] = None,
                 group: Optional[ProcessGroup] = None, schedule: str = "1f1b") -> None:
        super().__init__()
        pg = resolve_group(group)
        if not isinstance(parts, (list, tuple)):
            parts = pipeline_split(parts, pg.size)
        parts = list(parts)
        for i, part in enumerate(parts):
            if not isinstance(part, Module):
                raise TypeError(f"Pipe part {i} must be a Module, got {type(part).__name__}")
        if not parts or len(parts) % pg.size:
            raise ValueError(f"Pipe needs a multiple of the pipeline group's size ({pg.size}) "
                             f"parts, got {len(parts)}")
        if schedule.lower() not in _SCHEDULES:
            raise ValueError(f"Pipe schedule must be one of {_SCHEDULES}, got {schedule!r}")
        indices = list(range(pg.rank, len(parts), pg.size))
        self.local = ModuleList(parts[i] for i in indices)
        stages = [PipelineStage(parts[i], i, len(parts), group) for i in indices]
        self.stages: List[PipelineStage] = stages
        if len(parts) > pg.size:
            self.schedule = ScheduleInterleaved1F1B(stages, chunks, loss_fn)
        elif schedule.lower() == "gpipe":
            self.schedule = ScheduleGPipe(stages[0], chunks, loss_fn)
        else:
            self.schedule = Schedule1F1B(stages[0], chunks, loss_fn)

    def step(self, *args: Any, target: Any = None, losses: Optional[list] = None) -> None:
        """One batch forward and backward (see ``PipelineSchedule.step``)."""
        return self.schedule.step(*args, target=target, losses=losses)

    forward = step

    def timeline(self, gather: bool = True) -> List[Event]:
        return self.schedule.timeline(gather)
