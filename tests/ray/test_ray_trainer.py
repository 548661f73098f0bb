"""RayTrainer on a real Ray cluster of two nodes (``conftest.ray_cluster``): the digits MLP on 2
workers trains as the same run under our launcher does; the loop sees its ranks and the job's
group (tcp across the nodes); a loop that raises fails the run naming its rank; nothing is left
(the ``leftovers`` fixture; the run's Ray actors are gone)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import launcher_losses, live_workers_of, trainer
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytest.importorskip("ray")
pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]


def test_digits_on_two_nodes_equals_the_launcher_run(ray_cluster, tmp_path):
    import ray_jobs
    result = trainer(ray_jobs.digits_loop, tmp_path, "digits").fit()
    assert result.error is None and result.attempts == 1
    reference = launcher_losses(tmp_path)
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose(result.metrics[key], reference[key], rtol=1e-6, err_msg=key)
    assert reference["train_loss"][-1] < reference["train_loss"][0]  # it learns
    assert result.checkpoint is None and result.path == str(tmp_path / "digits")
    assert live_workers_of("digits") == []


def test_the_loop_sees_its_ranks_and_the_job(ray_cluster, tmp_path):
    import ray_jobs
    out = tmp_path / "out"
    out.mkdir()
    result = trainer(ray_jobs.context_loop, tmp_path, "context", config={"out": str(out)}).fit()
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for rank, record in enumerate(seen):
        assert record == {"rank": rank, "size": 2, "local_rank": 0, "local_world_size": 1,
                          "node_rank": rank, "backend": "tcp", "sum": 3.0,
                          "env_rank": str(rank), "checkpoint": None,
                          "config": {"out": str(out)}}, record
    assert result.metrics["rank"] == 0 and result.metrics["sum"] == 3.0
    assert result.metrics_history == [{"first": 1}, result.metrics]
    assert live_workers_of("context") == []


def test_a_loop_that_raises_fails_the_run_naming_its_rank(ray_cluster, tmp_path):
    import ray_jobs
    from neural_arch.ray import TrainingFailedError
    with pytest.raises(TrainingFailedError) as caught:
        trainer(ray_jobs.raising_loop, tmp_path, "raising",
                config={"rank": 1, "step": 7}).fit()
    message = str(caught.value)
    assert "worker rank 1 (pid" in message and "raised ValueError: bad batch at step 7" in message
    assert "failed 1 time(s), more than FailureConfig(max_failures=0)" in message
    assert list(caught.value.worker_failures) == [1]
    assert isinstance(caught.value.worker_failures[1], ValueError)
    assert caught.value.result.error is caught.value
    assert live_workers_of("raising") == []
