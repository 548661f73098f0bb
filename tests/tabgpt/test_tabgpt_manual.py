"""The guide's hand-written loop: ``DistributedManager``, ``GradientSynchronization`` (on real
processes, against the mean computed here) and ``CommunicationProfiler``."""
from __future__ import annotations

import time

import numpy as np
import pytest

from neural_arch.tabgpt.training import (CommunicationProfiler, DistributedConfig,
                                         DistributedTrainingMonitor, GradientSynchronization)

from dist_harness import run_ranks
from leftovers_fixture import leftovers  # noqa: F401
import tabgpt_jobs as jobs

pytestmark = pytest.mark.timeout(60)


def _rank_gradients(rank: int, params) -> list:
    return [np.random.default_rng((rank, i)).normal(size=p.array.shape).astype(p.array.dtype)
            for i, p in enumerate(params)]


def _synchronise(rank: int, world: int, bucket_mb: float) -> list:
    from neural_arch.tabgpt.training import DistributedManager
    manager = DistributedManager(DistributedConfig(world_size=world, rank=rank)).initialize()
    model = jobs.tiny_classifier(jobs.wine()[2])
    params = list(model.parameters())
    for p, grad in zip(params, _rank_gradients(rank, params)):
        p.grad = grad
    GradientSynchronization(DistributedConfig(bucket_size_mb=bucket_mb)).synchronize_gradients(
        model, manager)
    return [p.grad for p in params]


@pytest.mark.parametrize("bucket_mb", [25, 0.001])  # one bucket; many (about 1 KiB each)
def test_gradients_become_their_mean_over_the_ranks(bucket_mb):
    results = run_ranks(_synchronise, 2, "shm", args=(bucket_mb,), timeout=30)
    params = list(jobs.tiny_classifier(jobs.wine()[2]).parameters())
    expected = [(a + b) / 2 for a, b in zip(_rank_gradients(0, params),
                                            _rank_gradients(1, params))]
    for rank_grads in results:
        for got, want in zip(rank_grads, expected):
            np.testing.assert_allclose(got, want, rtol=1e-6)


def test_the_profiler_times_operations_and_refuses_an_unknown_id():
    profiler = CommunicationProfiler()
    op_id = profiler.start_operation("allreduce", data_size_bytes=4_000_000)
    time.sleep(0.01)
    seconds = profiler.end_operation(op_id)
    stats = profiler.get_communication_stats()["allreduce"]
    assert stats["count"] == 1 and stats["total_bytes"] == 4_000_000 and seconds >= 0.01
    assert stats["avg_bandwidth_mbps"] == pytest.approx(4.0 / seconds)
    with pytest.raises(ValueError, match=r"end_operation\(1\): no operation with that id"):
        profiler.end_operation(op_id)
    with pytest.raises(ValueError, match="bytes_transferred of 'x' must be an int >= 0"):
        profiler.start_operation("x", data_size_bytes=-1)


def test_the_monitor_by_hand_as_in_the_guides_loop(tmp_path):
    monitor = DistributedTrainingMonitor(log_dir=str(tmp_path), rank=0, world_size=2,
                                         monitoring_interval=0.01)
    monitor.start_monitoring()
    for step in range(1, 4):
        monitor.log_training_step(step=step, epoch=0, loss=1.0, learning_rate=1e-3,
                                  batch_size=8, step_time=0.5)
    op_id = monitor.start_communication_profiling("allreduce", data_size_bytes=1024)
    time.sleep(0.02)
    monitor.end_communication_profiling(op_id)
    monitor.stop_monitoring()
    stats = monitor.get_training_statistics()
    assert stats["step_timing"]["avg_step_time"] == 0.5
    assert stats["samples_per_second"] == pytest.approx(3 * 8 * 2 / 1.5)
    assert stats["communication_stats"]["allreduce"]["total_bytes"] == 1024
    assert stats["communication_stats"]["overall"]["communication_efficiency"] > 0
    assert stats["resource_stats"]["samples"] >= 1
    with pytest.raises(ValueError, match="step_time must be > 0"):
        monitor.log_training_step(step=4, epoch=0, loss=1.0, learning_rate=1e-3,
                                  batch_size=8, step_time=0.0)
