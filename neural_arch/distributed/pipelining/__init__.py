"""Pipeline parallelism (names follow ``torch.distributed.pipelining``).

``pipeline_split(model, num_stages)`` cuts a model into stage modules; ``PipelineStage`` is
the piece one rank runs; ``ScheduleGPipe``, ``Schedule1F1B`` and ``ScheduleInterleaved1F1B``
run micro-batches through the stages, forward and backward; ``Pipe([...], chunks=m)`` does all
of it in one line. Activations and gradients travel with ``batch_isend_irecv`` in batches
whose two sides pair up (``plan``), so no schedule can deadlock, whatever the transport buffers.
A schedule's ``timeline()`` says when each pass ran; ``timeline`` writes it as a trace or a
picture and measures the bubble.

A sketch for two ranks (``torchrun``-style launch, ``init_process_group`` done)::

    stages = pipeline_split(model, world_size)
    stage = PipelineStage(stages[rank], rank, world_size)
    schedule = Schedule1F1B(stage, n_microbatches=4, loss_fn=loss_fn)
    opt = SGD(stage.submodule.parameters(), lr=0.1)
    opt.zero_grad()
    schedule.step(x) if rank == 0 else schedule.step(target=y, losses=losses)
    opt.step()
"""
from __future__ import annotations

from .pipe import Pipe
from .schedules import (PipelineSchedule, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B,
                        split_microbatches)
from .split import GPTStage, balanced_bounds, pipeline_split
from .stage import PipelineStage
from .timeline import (Event, bubble_fraction, chrome_trace, plot_timeline,
                       write_chrome_trace)

__all__ = ["Event", "GPTStage", "Pipe", "PipelineSchedule", "PipelineStage", "Schedule1F1B",
           "ScheduleGPipe", "ScheduleInterleaved1F1B", "balanced_bounds", "bubble_fraction",
           "chrome_trace", "pipeline_split", "plot_timeline", "split_microbatches",
           "write_chrome_trace"]
