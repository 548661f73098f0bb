"""``DistributedTuner(..., backend="ray")``: the trials run as Ray Tune trials on a small Ray
of this machine (``ray_local``), and come back as the same table as the Optuna backend's.

The objective is ``tune_jobs.curve``, whose loss is known for every config and step, so each
row is checked against it, and the best (x = 0.3) is known. The tests share one small Ray
(``ray_for_module``): starting one takes about 6 s on a two-core machine and stopping it 1-2 s,
which each test paid again. Nothing a test starts outlives it: the ``leftovers``
fixture watches each test from after Ray's start, so every trial's actor and worker processes
are checked gone when the test ends, and Ray's own processes are checked gone after its
shutdown at the end of the module."""
from __future__ import annotations

import os

import pytest

pytest.importorskip("optuna")
pytest.importorskip("ray.tune")  # Ray Tune's own packages (pandas, pyarrow) too

from neural_arch import tune  # noqa: E402
from leftovers import descendants, wait_gone  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

import tune_jobs  # noqa: E402
from ray_local import small_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(150), pytest.mark.slow]
XS = [0.9, 0.3, 0.6, 0.8]


@pytest.fixture(scope="module")
def ray_for_module():
    """One small Ray for the module's tests, shut down after the last; then every process it
    started must be gone (within a bounded wait)."""
    before = descendants(os.getpid())
    with small_ray():
        started = descendants(os.getpid()) - before
        yield
    assert wait_gone(started, 10.0) == [], "Ray's processes outlived its shutdown"


def curve_tuner(tmp_path, backend, xs, steps, scheduler=None, sleep=0.02, **settings):
    space = {"x": tune.uniform(0.0, 1.0), "steps": steps, "sleep": sleep}
    if settings.get("processes_per_trial", 1) > 1:  # curve waits for them all to start
        space["processes"] = settings["processes_per_trial"]
    return tune.DistributedTuner(
        tune_jobs.curve, space,
        num_samples=len(xs), metric="loss", mode="min", scheduler=scheduler,
        points_to_evaluate=[{"x": x} for x in xs], local_dir=str(tmp_path / backend),
        backend=backend, seed=0, verbose=False, **settings)


def table(results):
    return [(row["state"], row["config"], row["steps"], row["last_step"],
             round(row["loss"], 12)) for row in results]


def test_ray_tune_runs_the_trials_and_agrees_with_optuna(tmp_path, ray_for_module):
    on_ray = curve_tuner(tmp_path, "ray", XS, steps=4, max_concurrent_trials=2).tune()
    on_optuna = curve_tuner(tmp_path, "shm", XS, steps=4, max_concurrent_trials=2).tune()
    expected = [("COMPLETE", {"x": x, "steps": 4, "sleep": 0.02}, 4, 3,
                 round(tune_jobs.expected_loss(x, 3), 12)) for x in XS]
    assert table(on_optuna) == expected
    assert table(on_ray) == expected
    assert [row["trial"] for row in on_ray] == [0, 1, 2, 3]
    assert on_ray.best_config == on_optuna.best_config == {"x": 0.3, "steps": 4, "sleep": 0.02}
    for row in on_ray:
        assert row["dir"].startswith(str(tmp_path / "ray")) and row["error"] is None
        assert sorted(n for n in os.listdir(row["dir"]) if n.startswith("finished")) == [
            "finished_0"]
    assert on_ray.plot(str(tmp_path / "curves.png")).endswith("curves.png")


def test_asha_on_ray_stops_the_worse_trials_early(tmp_path, ray_for_module):
    steps = 20
    results = curve_tuner(tmp_path, "ray", [0.3, 0.9, 0.8, 0.95], steps=steps,
                          scheduler="asha", sleep=0.1, max_concurrent_trials=1).tune()
    assert [row["state"] for row in results] == ["COMPLETE"] + ["PRUNED"] * 3, table(results)
    assert results.trials[0]["last_step"] == steps - 1
    for row in results.trials[1:]:
        # ASHA's first rung is step 1; the stop reaches the trial a few reports later at most
        assert 1 <= row["last_step"] < steps // 2, row
        assert not any(n.startswith("finished") for n in os.listdir(row["dir"])), row
        pids = [int(open(os.path.join(row["dir"], n)).read())
                for n in os.listdir(row["dir"]) if n.startswith("pid_")]
        # while Ray still runs, so stopped with their trial (not by Ray's shutdown); the
        # actor's process ends just after the trial is reported stopped
        assert pids and wait_gone(pids, 5.0) == [], row
    assert results.best_config["x"] == 0.3


def test_a_trial_of_two_processes_runs_over_ray_trainer(tmp_path, ray_for_module):
    tune_jobs.run_two_rank_trials(tmp_path, max_concurrent_trials=1, backend="ray",
                                  verbose=False)


def test_a_trial_that_raises_fails_alone_on_ray(tmp_path, ray_for_module):
    results = tune.DistributedTuner(
        tune_jobs.failing_curve, {"x": tune.uniform(0.0, 1.0), "steps": 3, "sleep": 0.0},
        num_samples=2, points_to_evaluate=[{"x": 0.9}, {"x": 0.2}], local_dir=str(tmp_path),
        backend="ray", verbose=False).tune()
    assert [row["state"] for row in results] == ["FAIL", "COMPLETE"]
    assert results.trials[0]["error"] == "raised ValueError: x=0.9 is too large"
    assert results.best_config["x"] == 0.2


def test_settings_the_ray_backend_cannot_take_are_refused():
    with pytest.raises(ValueError, match="storage='study.db' is an Optuna study's storage"):
        tune.DistributedTuner(tune_jobs.curve, {"x": tune.uniform(0, 1)}, storage="study.db",
                              backend="ray")
    with pytest.raises(ValueError, match="trial_timeout=5 is not supported"):
        tune.DistributedTuner(tune_jobs.curve, {"x": tune.uniform(0, 1)}, trial_timeout=5,
                              backend="ray")


def test_a_pruned_trial_of_two_processes_stops_its_workers(tmp_path, ray_for_module):
    results = curve_tuner(tmp_path, "ray", [0.3, 0.9], steps=30, scheduler="asha",
                          sleep=0.1, processes_per_trial=2, max_concurrent_trials=1).tune()
    assert [row["state"] for row in results] == ["COMPLETE", "PRUNED"], table(results)
    pruned = results.trials[1]
    pids = [int(open(os.path.join(pruned["dir"], n)).read())
            for n in os.listdir(pruned["dir"]) if n.startswith("pid_")]
    assert len(pids) == 2 and pruned["last_step"] < 15
    assert wait_gone(pids, 5.0) == []  # while Ray still runs: stopped with their trial
