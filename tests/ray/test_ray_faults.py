"""Faults of a RayTrainer run on a real two-node Ray cluster: a worker's process SIGKILLed
mid-run is restarted with the whole group from the last checkpoint every worker reported, losing
at most the checkpoint interval, and the run ends with the weights of a run without the fault;
more failures than ``max_failures`` end in an error naming the worker and every attempt. Nothing
is left: no process, no /dev/shm segment (``leftovers``), no Ray actor of the run."""
from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

from conftest import live_workers_of
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]
TOTAL, INTERVAL, KILL_AFTER = 30, 5, 12  # steps; a checkpoint every INTERVAL; kill past KILL_AFTER


def steps_of(out, rank):
    """[(pid, step)] that ``rank`` completed, in order."""
    path = out / f"steps.rank{rank}"
    if not path.exists():
        return []
    return [tuple(map(int, line.split())) for line in path.read_text().splitlines() if line]


def kill_when_past(out, rank, step, killed):
    """SIGKILL the worker of ``rank`` once it has completed ``step``."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done = steps_of(out, rank)
        if done and done[-1][1] >= step:
            os.kill(done[-1][0], signal.SIGKILL)
            killed.append(done[-1])
            return
        time.sleep(0.01)


def run(tmp_path, name, max_failures, **config):
    import ray_jobs
    from neural_arch.ray import (CheckpointConfig, FailureConfig, RayTrainer, RunConfig,
                                 ScalingConfig)
    out = tmp_path / "out"
    out.mkdir()
    config = {"out": str(out), "total": TOTAL, "interval": INTERVAL, **config}
    return out, RayTrainer(ray_jobs.stepped_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, storage_path=str(tmp_path),
                                                checkpoint_config=CheckpointConfig(num_to_keep=2),
                                                failure_config=FailureConfig(max_failures)))


def test_a_killed_worker_restarts_the_group_from_the_last_checkpoint(ray_cluster, tmp_path):
    import ray_jobs
    out, trainer = run(tmp_path, "killed", 1, step_sleep=0.05)
    killed = []
    killer = threading.Thread(target=kill_when_past, args=(out, 1, KILL_AFTER, killed))
    killer.start()
    result = trainer.fit()
    killer.join()
    assert killed, "the worker was never killed"
    assert result.error is None and result.attempts == 2
    done = steps_of(out, 1)
    first_pid = done[0][0]
    before = [s for p, s in done if p == first_pid]
    after = [s for p, s in done if p != first_pid]
    resumed_at = after[0]
    assert resumed_at % INTERVAL == 0 and resumed_at > 0, (before, after)  # from a checkpoint
    lost = before[-1] + 1 - resumed_at
    assert 0 <= lost <= INTERVAL, (before, after)
    assert after == list(range(resumed_at, TOTAL))
    # the weights equal one process's run over the whole batch, with no fault
    model, _ = ray_jobs.train_steps(0, TOTAL, 0, 1)
    for key, value in model.state_dict().items():
        np.testing.assert_allclose(result.metrics["weights"][key], np.asarray(value.array),
                                   rtol=1e-4, atol=1e-6, err_msg=key)
    kept = sorted(p.name for p in (tmp_path / "killed").iterdir() if p.name.startswith("check"))
    assert len(kept) == 2 and result.checkpoint.path.endswith(kept[-1]), kept
    assert live_workers_of("killed") == []


def test_more_failures_than_max_failures_end_in_an_error_naming_them(ray_cluster, tmp_path):
    from neural_arch.ray import TrainingFailedError
    out, trainer = run(tmp_path, "failing", 1, raise_at=7)
    with pytest.raises(TrainingFailedError) as caught:
        trainer.fit()
    message = str(caught.value)
    assert "failed 2 time(s), more than FailureConfig(max_failures=1)" in message, message
    for attempt in (1, 2):
        assert f"attempt {attempt}: worker rank 0 (pid" in message, message
    assert "raised RuntimeError: rank 0 fails at step 7" in message, message
    # the second attempt resumed from the checkpoint after step 4, so it ran steps 5.. only
    starts = [line.split()[1] for line in (out / "pid.rank0").read_text().splitlines()]
    assert starts == ["0", "5"], starts
    assert caught.value.result.checkpoint.path.endswith("checkpoint_000000")
    assert live_workers_of("failing") == []
