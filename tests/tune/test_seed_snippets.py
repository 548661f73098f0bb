"""The seed's snippets for the tuner and Ray Train, as written apart from their imports and
with tiny sizes: ``DistributedTuner(train_fn=..., search_space=..., num_gpus=..., trials_per_gpu=1)
.tune(num_samples=...)``, Ray Tune's ``tune.run(train_fn, config={...}, num_samples=...,
resources_per_trial={"gpu": 1})`` with ``analysis.best_config``, and ``RayTrainer(model,
config)`` inside ``train_fn``. Each checks what the snippet promises against what the trials
did (the best config is the trial of the best accuracy)."""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("optuna")
pytest.importorskip("ray")

from neural_arch import tune  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

import seed_jobs  # noqa: E402
import tune_jobs  # noqa: E402
import ray_local  # noqa: E402
from ray_local import small_ray  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


def weights(model):
    return {k: np.array(getattr(v, "array", v), copy=True) for k, v in model.state_dict().items()}


def test_the_seed_distributed_tuner_snippet(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train_function = tune_jobs.curve
    search_space = {"x": tune.uniform(0.0, 1.0), "steps": 2, "sleep": 0.0}
    # ---- as in the seed (num_gpus=32, num_samples=100 there)
    tuner = tune.DistributedTuner(
        train_fn=train_function,
        search_space=search_space,
        num_gpus=2,  # Run 32 trials in parallel!
        trials_per_gpu=1
    )

    best_params = tuner.tune(num_samples=3)
    # ----
    assert len(best_params) == 3 and best_params.count("COMPLETE") == 3
    assert best_params.best_config == min(best_params, key=lambda r: r["loss"])["config"]


def test_the_seed_tune_run_snippet_with_ray_trainer_inside(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # each trial's RayTrainer starts a Ray of its own, on loopback addresses
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
    monkeypatch.setenv("PYTHONPATH", ray_local.search_path())
    train_fn = seed_jobs.train_fn
    # ---- as in the seed (num_samples=20 there)
    analysis = tune.run(
        train_fn,
        config={
            "hidden_size": tune.choice([128, 256, 512]),
            "lr": tune.loguniform(1e-4, 1e-2),
            "batch_size": tune.choice([32, 64, 128])
        },
        num_samples=2,
        resources_per_trial={"gpu": 1}
    )

    print(f"Best config: {analysis.best_config}")
    # ----
    rows = analysis.trials
    assert [row["state"] for row in rows] == ["COMPLETE"] * 2, rows
    assert all(0.0 < row["accuracy"] <= 1.0 for row in rows)
    best = max(rows, key=lambda row: row["accuracy"])
    assert analysis.best_config == best["config"] == analysis.get_best_config("accuracy", "max")
    assert set(analysis.best_config) == {"hidden_size", "lr", "batch_size"}
    assert analysis.default_mode == "max"


def test_ray_trainer_model_first_trains_the_model_and_says_what_it_cannot_map(tmp_path,
                                                                             monkeypatch):
    # the run's folder, ~/ray_results by default, goes to tmp_path (not through HOME: Ray keeps
    # its cluster token under ~/.ray, and a Ray started later would not find the same one)
    monkeypatch.setenv("NEURAL_ARCH_RAY_STORAGE", str(tmp_path / "ray_results"))
    from neural_arch.ray import RayTrainer
    from neural_arch.ray.model_trainer import ModelRayTrainer
    model = seed_jobs.create_model(16)
    before = weights(model)
    with pytest.raises(ValueError, match=r"config\['optimizer'\] must be one of"):
        RayTrainer(model, {"optimizer": "lbfgs"})
    with pytest.raises(ValueError, match=r"config\['loss'\] cannot be mapped"):
        RayTrainer(model, {"loss": "mse"})
    with pytest.raises(ValueError, match=r"config\['lr'\] must be a number > 0, got -1"):
        RayTrainer(model, {"lr": -1})
    with small_ray():
        trainer = RayTrainer(model, {"lr": 0.01, "epochs": 2, "batch_size": 32,
                                     "hidden_size": 16})
        assert isinstance(trainer, ModelRayTrainer)
        with pytest.raises(TypeError, match="train_loader must be a neural_arch DataLoader"):
            trainer.fit([1, 2], None)
        trainer.fit(seed_jobs.train_loader, seed_jobs.val_loader)
    assert [r["epoch"] for r in trainer.history] == [1, 2]
    assert trainer.best_accuracy == max(r["val_accuracy"] for r in trainer.history)
    after = weights(model)
    assert any((after[k] != before[k]).any() for k in before)  # the trained weights came back
