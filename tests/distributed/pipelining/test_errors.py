"""Failures surface on every stage with names, never as a hang; bad arguments say what."""
import pytest

from dist_harness import run_ranks
from pipeline_cases import batch, make_mlp, mse


def _describe(exc):
    notes = " | ".join(getattr(exc, "__notes__", []))
    return f"{type(exc).__name__}: {exc} || {notes}"


FAILING_STAGE = {  # the virtual stage that raises, of 3 ranks (6 chunks interleaved)
    "first": {"gpipe": 0, "1f1b": 0, "interleaved": 0},
    "middle": {"gpipe": 1, "1f1b": 1, "interleaved": 4},  # interleaved: rank 1's 2nd chunk
    "last": {"gpipe": 2, "1f1b": 2, "interleaved": 5},
}


def _failing_stage(rank, world_size, kind, failing, in_backward):
    from neural_arch.core.tensor import make_result
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                    ScheduleInterleaved1F1B, pipeline_split)
    from neural_arch.nn import Module

    class Explodes(Module):
        """The identity, until its second micro-batch's forward (or backward) raises."""

        def __init__(self):
            super().__init__()
            self.calls = 0

        def forward(self, x):
            self.calls += 1
            if self.calls == 2 and not in_backward:
                raise RuntimeError("boom in the second micro-batch")

            def backward(grad, mb=self.calls):
                if mb == 2:
                    raise RuntimeError("boom in the second micro-batch")
                return (grad,)
            return make_result(x.array, (x,), backward) if in_backward else x

    v = 2 if kind == "interleaved" else 1
    n_stages = world_size * v
    parts = pipeline_split(make_mlp(pairs=6), n_stages)
    parts[failing].append(Explodes())
    stages = [PipelineStage(parts[i], i, n_stages) for i in range(rank, n_stages, world_size)]
    if kind == "interleaved":
        schedule = ScheduleInterleaved1F1B(stages, 4, mse)
    else:
        schedule = (ScheduleGPipe if kind == "gpipe" else Schedule1F1B)(stages[0], 4, mse)
    x, y = batch(0)
    try:
        schedule.step(*((x,) if rank == 0 else ()),
                      **(dict(target=y, losses=[]) if rank == world_size - 1 else {}))
    except Exception as exc:
        return _describe(exc)
    return "finished"


def _check_every_stage_names(errors, kind, failing, pass_name="forward"):
    """The raising stage re-raises its error with a note naming it; every other stage fails
    with PeerFailureError naming that stage, its rank and its error, however far away."""
    culprit = failing % len(errors)
    where = f"in pipeline stage {failing} (rank {culprit}), {pass_name} of micro-batch 1"
    assert errors[culprit].startswith("RuntimeError: boom"), errors[culprit]
    assert where in errors[culprit], errors[culprit]
    for rank, error in enumerate(errors):
        if rank != culprit:
            assert error.startswith("PeerFailureError"), (kind, failing, rank, error)
            assert f"peer rank {culprit} failed" in error, (kind, failing, rank, error)
            assert f"raised RuntimeError: boom in the second micro-batch ({where})" in error, (
                kind, failing, rank, error)
            assert f"while pipeline rank {rank} exchanged" in error, (kind, failing, rank, error)


@pytest.mark.parametrize("position", ["first", "middle", "last"])
@pytest.mark.parametrize("kind", ["gpipe", "1f1b", "interleaved"])
def test_a_stage_that_raises_fails_every_stage_naming_it(kind, position):
    # A stage two hops away from the raising one only sees its neighbour leave: it still
    # names the raising stage, as does every stage when rank 0 (the store's server) raises.
    failing = FAILING_STAGE[position][kind]
    errors = run_ranks(_failing_stage, 3, "shm", timeout=120, args=(kind, failing, False))
    _check_every_stage_names(errors, kind, failing)


@pytest.mark.parametrize("kind,failing", [("1f1b", 1), ("interleaved", 3)])
def test_a_stage_whose_backward_raises_fails_every_stage_naming_it(kind, failing):
    errors = run_ranks(_failing_stage, 3, "shm", timeout=120, args=(kind, failing, True))
    _check_every_stage_names(errors, kind, failing, "backward")


@pytest.mark.parametrize("position", ["first", "last"])
def test_a_raising_stage_is_named_on_every_transport(backend, position):
    failing = FAILING_STAGE[position]["1f1b"]
    errors = run_ranks(_failing_stage, 3, backend, timeout=120, args=("1f1b", failing, False))
    _check_every_stage_names(errors, "1f1b", failing)


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
