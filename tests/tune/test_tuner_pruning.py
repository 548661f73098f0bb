"""Pruning: a trial the pruner stops ends at once, all its processes with it.

The configs are fixed (``points_to_evaluate``), from good to bad, so which trials must be
pruned is known: a bad trial's loss is above every good one's at every step."""
from __future__ import annotations

import os
import time

import pytest

pytest.importorskip("optuna")

from neural_arch import tune  # noqa: E402
from leftovers import alive  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

import tune_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(90)
STEPS = 20


def pids(row):
    return [int(open(os.path.join(row["dir"], name)).read())
            for name in os.listdir(row["dir"]) if name.startswith("pid_")]


def finished(row):
    return any(name.startswith("finished_") for name in os.listdir(row["dir"]))


def tuner(tmp_path, scheduler, xs, concurrent, processes=1):
    space = {"x": tune.uniform(0.0, 1.0), "steps": STEPS, "sleep": 0.1, "processes": processes}
    return tune.DistributedTuner(
        tune_jobs.curve, space,
        num_samples=len(xs), scheduler=scheduler, max_concurrent_trials=concurrent,
        processes_per_trial=processes, local_dir=str(tmp_path),
        points_to_evaluate=[{"x": x} for x in xs])


def test_asha_stops_the_worse_trials_at_their_first_rung(tmp_path):
    start = time.monotonic()
    results = tuner(tmp_path, "asha", [0.3, 0.9, 0.8], concurrent=1, processes=2).tune()
    assert [row["state"] for row in results] == ["COMPLETE", "PRUNED", "PRUNED"]
    first = results.trials[0]
    for row in results.trials[1:]:
        # rung 0 is step 1: the trial is stopped there, long before its 20 steps
        assert row["last_step"] == 1 and not finished(row), row
        assert row["seconds"] < first["seconds"], (row, first)
        assert len(pids(row)) == 2 and not any(alive(pid) for pid in pids(row))
    assert finished(first)
    assert time.monotonic() - start < 3 * first["seconds"]


@pytest.mark.slow
def test_the_median_rule_prunes_once_three_trials_finished(tmp_path):
    xs = [0.3, 0.32, 0.31, 0.9, 0.95, 0.85]
    results = tuner(tmp_path, "median", xs, concurrent=2).tune()
    states = [row["state"] for row in results]
    assert states[:3] == ["COMPLETE"] * 3 and states[4:] == ["PRUNED"] * 2, states
    for row in results.trials[4:]:  # started once (or about when) three had finished
        assert row["last_step"] < STEPS // 2 and not finished(row), row
        assert not any(alive(pid) for pid in pids(row))
    assert results.best_config["x"] == 0.3
