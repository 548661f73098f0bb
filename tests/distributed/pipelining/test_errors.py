"""Failures surface on every stage with names, never as a hang; bad arguments say what."""
import pytest

from dist_harness import run_ranks
from pipeline_cases import batch, make_mlp, mse


def _describe(exc):
    notes = " | ".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc} || {notes}"


def _failing_stage(rank, world_size):
    from neural_arch.distributed.pipelining import PipelineStage, Schedule1F1B, pipeline_split
    from neural_arch.nn import Module

    class Explodes(Module):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 2:
                raise RuntimeError("boom in the second micro-batch")
            return x

    parts = pipeline_split(make_mlp(pairs=3), world_size)
    if rank == 1:
        parts[1].append(Explodes())
    schedule = Schedule1F1B(PipelineStage(parts[rank], rank, world_size), 4, mse)
    x, y = batch(0)
    try:
        if rank == 0:
            schedule.step(x)
        elif rank == world_size - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
    except Exception as exc:
        return _describe(exc)
    return "finished"


def test_a_stage_that_raises_fails_every_stage_naming_it(backend):
    errors = run_ranks(_failing_stage, 3, backend, timeout=120)
    assert errors[1].startswith("RuntimeError: boom"), errors[1]
    assert "in pipeline stage 1 (rank 1), forward of micro-batch 1" in errors[1]
    for rank in (0, 2):
        assert errors[rank].startswith("PeerFailureError"), errors[rank]
        assert "peer rank 1" in errors[rank], errors[rank]
        assert "pipeline rank(s) [1]" in errors[rank], errors[rank]


def _mismatch(rank, world_size, case):
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                    pipeline_split)
    parts = pipeline_split(make_mlp(pairs=2), world_size)
    stage = PipelineStage(parts[rank], rank, world_size)
    if case == "count":
        schedule = Schedule1F1B(stage, 2 if rank == 0 else 4, mse)
    else:
        schedule = (ScheduleGPipe if rank == 0 else Schedule1F1B)(stage, 2, mse)
    x, y = batch(0)
    try:
        schedule.step(x) if rank == 0 else schedule.step(target=y, losses=[])
    except ValueError as exc:
        return str(exc)
    return "finished"


@pytest.mark.parametrize("case", ["count", "schedule"])
def test_stages_that_disagree_fail_with_both_values(case):
    errors = run_ranks(_mismatch, 2, "shm", timeout=60, args=(case,))
    for error in errors:
        assert "pipeline stages disagree" in error, error
        if case == "count":
            assert "stage 0 (rank 0): Schedule1F1B with n_microbatches=2" in error, error
            assert "stage 1 (rank 1): Schedule1F1B with n_microbatches=4" in error, error
        else:
            assert "stage 0 (rank 0): ScheduleGPipe" in error, error
            assert "stage 1 (rank 1): Schedule1F1B" in error, error


def _bad_arguments(rank, world_size):
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B,
                                                    ScheduleInterleaved1F1B, pipeline_split)
    found = {}

    def attempt(name, call):
        try:
            call()
        except (ValueError, TypeError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"

    parts = pipeline_split(make_mlp(pairs=2), 2 * world_size)
    mine = [PipelineStage(parts[i], i, 2 * world_size) for i in (rank, rank + world_size)]
    attempt("no micro-batches", lambda: ScheduleInterleaved1F1B(mine, 0, mse))
    attempt("wrong rank", lambda: PipelineStage(parts[0], 1 - rank, world_size))
    attempt("not a module", lambda: PipelineStage(lambda x: x, rank, world_size))
    stage = PipelineStage(pipeline_split(make_mlp(pairs=2), world_size)[rank], rank, world_size)
    attempt("two stages for 1F1B", lambda: Schedule1F1B(mine[0], 2, mse))
    schedule = Schedule1F1B(stage, 5, mse)
    x, y = batch(0)
    if rank == 0:
        attempt("no input", lambda: schedule.step())
        attempt("indivisible", lambda: schedule.step(x))
    else:
        attempt("no target", lambda: schedule.step())
        attempt("indivisible", lambda: schedule.step(target=y, losses=[]))
    return found


def test_bad_arguments_name_the_values():
    first, last = run_ranks(_bad_arguments, 2, "shm", timeout=60)
    for found in (first, last):
        assert "n_microbatches must be at least 1, got 0" in found["no micro-batches"]
        assert "runs on group rank" in found["wrong rank"]
        assert found["not a module"].startswith("TypeError")
        assert "num_stages 4 must equal the pipeline group's size 2" in found[
            "two stages for 1F1B"]
        assert "batch size 24" in found["indivisible"] and "5 equal" in found["indivisible"]
    assert "first pipeline stage: call step(x)" in first["no input"]
    assert "last pipeline stage: call step(..., target=y" in last["no target"]
