"""``DistributedTuner``: trials in processes of their own, side by side, read back as a table.

Each trial's reports and result are compared with what its train function computes from its
config (``tune_jobs.expected_loss``), so a trial whose values went astray, or a best that is
not the best, fails."""
from __future__ import annotations

import json
import os

import pytest

pytest.importorskip("optuna")

from neural_arch import tune  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

import tune_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(90)


def intervals(rows):
    """(first, last) report time of each trial, from its reports.jsonl."""
    found = []
    for row in rows:
        with open(os.path.join(row["dir"], "reports.jsonl")) as handle:
            times = [json.loads(line)["time"] for line in handle]
        found.append((min(times), max(times)))
    return found


def most_at_once(spans):
    events = sorted([(start, 1) for start, _ in spans] + [(end, -1) for _, end in spans])
    level = peak = 0
    for _, change in events:
        level += change
        peak = max(peak, level)
    return peak


def test_four_trials_two_at_a_time_and_the_best_is_the_best(tmp_path):
    tuner = tune.DistributedTuner(
        tune_jobs.curve, {"x": tune.uniform(0.0, 1.0), "steps": 6, "sleep": 0.1},
        num_samples=4, metric="loss", mode="min", max_concurrent_trials=2, seed=3,
        local_dir=str(tmp_path))
    results = tuner.tune()
    assert [row["state"] for row in results] == ["COMPLETE"] * 4
    for row in results:
        x = row["config"]["x"]
        assert row["config"]["steps"] == 6 and 0.0 <= x <= 1.0
        assert row["loss"] == pytest.approx(tune_jobs.expected_loss(x, 5))
        assert row["steps"] == 6 and row["error"] is None
    best = min(results, key=lambda row: row["loss"])
    assert results.best_result == best and tuner.best_result == best
    assert tuner.best_config == best["config"] == results.best_config
    assert most_at_once(intervals(results.trials)) == 2
    path = results.plot(str(tmp_path / "curves.png"))
    with open(path, "rb") as handle:
        assert handle.read(8) == b"\x89PNG\r\n\x1a\n"


def test_a_trial_of_two_processes_is_one_job(tmp_path):
    tune_jobs.run_two_rank_trials(tmp_path, max_concurrent_trials=2)


def test_the_seed_spelling_with_a_trainer_inside(tmp_path):
    tuner = tune.DistributedTuner(
        train_fn=tune_jobs.digits_mlp,
        search_space={"lr": tune.loguniform(0.01, 0.5), "hidden": tune.randint(4, 9)},
        num_gpus=2, trials_per_gpu=1, local_dir=str(tmp_path), seed=0, verbose=False)
    assert tuner.max_concurrent_trials == 2  # on a machine without GPUs: 2 slots
    results = tuner.tune(num_samples=3)
    assert [row["state"] for row in results] == ["COMPLETE"] * 3
    for row in results:
        assert 4 <= row["config"]["hidden"] <= 8 and row["steps"] == 3
        assert row["last_step"] == 3  # epochs numbered from 1
    assert results.best_config == min(results, key=lambda r: r["loss"])["config"]
