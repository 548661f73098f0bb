"""``setup_distributed_training(...).train()`` with real processes: two ranks equal one process
with the same global batch, and the monitor's statistics are the measured ones."""
from __future__ import annotations

import statistics

import numpy as np
import pytest

from neural_arch.tabgpt.training import (DistributedConfig, DistributedTrainingMonitor,
                                         TrainingConfig, setup_distributed_training)

from leftovers_fixture import leftovers  # noqa: F401
import tabgpt_jobs as jobs

pytestmark = pytest.mark.timeout(60)


def _train(world: int, folder, backend: str = "gloo", epochs: int = 2):
    train, test, config = jobs.wine()
    model = jobs.tiny_classifier(config)
    trainer = setup_distributed_training(
        model, train, test,
        training_config=TrainingConfig(batch_size=16 // world, num_epochs=epochs,
                                       learning_rate=3e-3, logging_steps=1,
                                       output_dir=str(folder)),
        distributed_config=DistributedConfig(backend=backend, world_size=world))
    return trainer, trainer.train(), model


@pytest.mark.slow
def test_two_processes_equal_one_with_the_global_batch_and_the_monitor_measures(tmp_path):
    one, one_history, one_model = _train(1, tmp_path / "one")
    two, two_history, two_model = _train(2, tmp_path / "two")
    # the same losses, step by step, and the same trained weights (back in the parent's model)
    losses_one = [r["loss"] for r in jobs.records(tmp_path / "one")]
    losses_two = [r["loss"] for r in jobs.records(tmp_path / "two")]
    assert len(losses_one) == len(losses_two) == 18  # 2 epochs of 9 batches of 16 rows
    np.testing.assert_allclose(losses_two, losses_one, rtol=0, atol=1e-6)
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(two_history[key], one_history[key], atol=1e-6, err_msg=key)
    trained = two_model.state_dict()
    d = one_model.config.d_token
    for name, value in one_model.state_dict().items():
        mine = trained[name]
        if name.endswith("in_proj_bias"):
            # the key bias cancels in the softmax: its gradient is float rounding only, which
            # Adam divides by its own size, so the two runs move it apart; the rest agrees
            mine, value = np.delete(mine, np.s_[d:2 * d]), np.delete(value, np.s_[d:2 * d])
        np.testing.assert_allclose(mine, value, atol=1e-6, err_msg=name)
    untrained = jobs.tiny_classifier(jobs.wine()[2]).state_dict()
    assert any(not np.allclose(trained[n], v) for n, v in untrained.items())

    # the monitor's numbers: measured, positive and those of rank 0's metrics.jsonl
    stats = two.monitor.get_training_statistics()
    train_records = jobs.records(tmp_path / "two")
    assert stats["world_size"] == 2 and stats["steps"] == 17  # the first step is set-up
    timing = stats["step_timing"]
    assert 0 < timing["min_step_time"] <= timing["avg_step_time"] <= timing["max_step_time"]
    assert stats["train_records"] == len(train_records)
    assert stats["samples_per_second"] == pytest.approx(
        statistics.fmean(r["samples_per_second"] for r in train_records), rel=1e-12)
    overall = stats["communication_stats"]["overall"]
    assert overall["comm_seconds"] == pytest.approx(
        sum(r["comm_seconds"] for r in train_records), rel=1e-9)
    gradient_sync = stats["communication_stats"]["shared_bucket_all_reduce"]
    assert gradient_sync["count"] == 18 and gradient_sync["total_bytes"] > 0
    assert overall["communication_efficiency"] > 0 and overall["total_time_ms"] > 0
    assert stats["resource_stats"]["peak_rss_mb"] > 0
    # scaling efficiency: against the one-process run's measured samples/s
    baseline = one.monitor.get_training_statistics()["samples_per_second"]
    assert baseline > 0 and stats["scaling_efficiency"] is None
    two.monitor.set_baseline(baseline)
    efficiency = two.monitor.get_training_statistics()["scaling_efficiency"]
    assert efficiency == pytest.approx(stats["samples_per_second"] / (2 * baseline))


@pytest.mark.slow
def test_on_tcp_the_monitor_counts_the_bytes_the_transport_sent(tmp_path):
    trainer, _, model = _train(2, tmp_path, backend="tcp", epochs=1)
    overall = trainer.monitor.get_training_statistics()["communication_stats"]["overall"]
    gradient_bytes = sum(p.array.nbytes for p in model.parameters())
    # a ring all-reduce over 2 ranks sends each rank's half twice: the gradients once a step
    assert overall["sent_bytes"] >= 9 * gradient_bytes
    assert overall["sent_mb_per_second"] > 0


def test_one_process_baseline_is_measured_and_gives_the_efficiency(tmp_path):
    train, test, config = jobs.wine()
    monitor = DistributedTrainingMonitor(log_dir=str(tmp_path / "logs"))
    from neural_arch.tabgpt.training import DistributedTrainer
    trainer = DistributedTrainer(jobs.tiny_classifier(config),
                                 TrainingConfig(batch_size=16, max_steps=4, logging_steps=1,
                                                output_dir=str(tmp_path)),
                                 DistributedConfig(world_size=1), train_dataset=train,
                                 monitor=monitor)
    baseline = trainer.measure_baseline(max_steps=4)
    assert baseline > 0 and monitor.baseline == baseline
    trainer.train()
    stats = monitor.get_training_statistics()
    assert stats["world_size"] == 1 and stats["steps"] == 3
    assert stats["scaling_efficiency"] == pytest.approx(stats["samples_per_second"] / baseline)
    assert (tmp_path / "logs" / "training_statistics.json").is_file()
