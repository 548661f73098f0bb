"""MLflow tracking of a Trainer run: ``Trainer.fit(..., mlflow_experiment=...)``,
``PyTorchDDPTrainer.fit(..., mlflow_experiment=...)`` and the ``MLflowLogger`` callback.

The runs are read back with MLflow's own client, and compared with what the Trainer returned
(its History) and wrote (metrics.jsonl): one run however many processes, its parameters, its
metric histories, its artifacts."""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

pytest.importorskip("mlflow")

import neural_arch.functional as F  # noqa: E402
from mlflow.tracking import MlflowClient  # noqa: E402
from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.data import DataLoader, TensorDataset  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.optim import SGD  # noqa: E402
from neural_arch.training import (MLflowLogger, PyTorchDDPTrainer, Trainer,  # noqa: E402
                                  TrainingConfig)
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

pytestmark = pytest.mark.timeout(120)


def data(rows: int = 48, seed: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6)).astype(np.float32)
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(np.int64)
    return TensorDataset(x[:32], y[:32]), TensorDataset(x[32:], y[32:])


def model():
    manual_seed(0)
    return MLP([6, 8, 2])


def config(tmp_path, **changes):
    return TrainingConfig(**{"epochs": 2, "seed": 5, "verbose": False, "progress_bar": False,
                             "log_interval": 2, "metrics_dir": str(tmp_path / "run"),
                             "checkpoint_dir": str(tmp_path / "checkpoints"), **changes})


def only_run(uri: str, experiment: str):
    client = MlflowClient(tracking_uri=uri)
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no experiment {experiment!r} in {uri}"
    runs = client.search_runs([found.experiment_id])
    assert len(runs) == 1, [r.info.run_id for r in runs]
    return client, runs[0]


def values(client, run, key):
    return [m.value for m in sorted(client.get_metric_history(run.info.run_id, key),
                                    key=lambda m: (m.step, m.timestamp))]


def artifact_paths(client, run, path=None):
    found = []
    for item in client.list_artifacts(run.info.run_id, path):
        found += artifact_paths(client, run, item.path) if item.is_dir else [item.path]
    return found


def train_records(tmp_path):
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.slow
def test_two_processes_make_one_run_that_matches_the_history(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'tracking.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)  # the workers inherit it
    train, val = data()
    net = model()
    trainer = Trainer(net, SGD(net.parameters(), lr=0.1), F.cross_entropy, config(tmp_path),
                      num_processes=2)
    history = trainer.fit(DataLoader(train, batch_size=4, shuffle=True),
                          DataLoader(val, batch_size=4), mlflow_experiment="digits")
    client, run = only_run(uri, "digits")
    params = run.data.params
    assert (params["world_size"], params["strategy"], params["epochs"], params["model"],
            params["optimizer"]) == ("2", "ddp", "2", "MLP", "SGD")
    assert run.info.status == "FINISHED"
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(values(client, run, f"epoch/{key}"), history[key],
                                   rtol=1e-6, err_msg=key)
    records = train_records(tmp_path)
    assert len(records) == history.steps // 2 and records
    np.testing.assert_allclose(values(client, run, "train/loss"), [r["loss"] for r in records],
                               rtol=1e-6)
    paths = artifact_paths(client, run)
    assert "loss.png" in paths and "metrics.jsonl" in paths, paths
    assert any(p.startswith("checkpoint/") for p in paths), paths
    # beside the database, not in the directory the test runs in
    assert run.info.artifact_uri.removeprefix("file://").startswith(f"{tmp_path}/artifacts/")


@pytest.mark.slow
def test_the_ddp_trainer_logs_into_a_sqlite_store_in_the_metrics_dir(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    train, _ = data()
    trainer = PyTorchDDPTrainer(model(), num_gpus=2, batch_size=4, epochs=1, optimizer="sgd",
                                learning_rate=0.1, seed=5, verbose=False, progress_bar=False,
                                metrics_dir=str(tmp_path / "run"))
    history = trainer.fit(train, mlflow_experiment="ddp")
    client, run = only_run(f"sqlite:///{tmp_path / 'run' / 'mlflow.db'}", "ddp")
    assert run.data.params["world_size"] == "2"
    np.testing.assert_allclose(values(client, run, "epoch/train_loss"), history["train_loss"],
                               rtol=1e-6)
    artifacts = run.info.artifact_uri.removeprefix("file://")
    assert artifacts.startswith(f"{tmp_path / 'run' / 'artifacts'}/"), artifacts
    assert sorted(os.listdir(artifacts)) == ["loss.png", "metrics.jsonl"]


def test_a_resumed_fit_goes_on_in_the_same_run(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'tracking.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    train, _ = data()

    def fit(epochs: int, resume: bool):
        net = model()
        trainer = Trainer(net, SGD(net.parameters(), lr=0.1), F.cross_entropy,
                          config(tmp_path, epochs=epochs, resume=resume))
        return trainer.fit(DataLoader(train, batch_size=8), mlflow_experiment="resumed")

    fit(1, False)
    history = fit(2, True)  # the second epoch, from the first one's checkpoint
    client, run = only_run(uri, "resumed")
    np.testing.assert_allclose(values(client, run, "epoch/train_loss"), history["train_loss"],
                               rtol=1e-6)
    assert len(history) == 2 and run.info.status == "FINISHED"


def test_the_logger_is_the_same_as_the_fit_argument_and_is_added_once(tmp_path, monkeypatch):
    uri = f"sqlite:///{tmp_path / 'tracking.db'}"
    train, _ = data()
    net = model()
    logger = MLflowLogger("explicit", tracking_uri=uri, params={"note": "given"})
    trainer = Trainer(net, SGD(net.parameters(), lr=0.1), F.cross_entropy,
                      config(tmp_path, epochs=1, checkpoint_dir=None), callbacks=[logger])
    trainer.fit(DataLoader(train, batch_size=8), mlflow_experiment="explicit")
    client, run = only_run(uri, "explicit")
    assert run.data.params["note"] == "given" and run.info.run_id == logger.run_id
    assert not any(p.startswith("checkpoint/") for p in artifact_paths(client, run))


def test_without_mlflow_the_extra_to_install_is_named(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
    net = model()
    trainer = Trainer(net, SGD(net.parameters(), lr=0.1), F.cross_entropy,
                      config(tmp_path, epochs=1), num_processes=2)
    with pytest.raises(RuntimeError, match=r"Trainer.fit: MLflow tracking needs the mlflow "
                                           r"package.*neural-arch\[mlflow\]"):
        trainer.fit(DataLoader(data()[0], batch_size=8), mlflow_experiment="none")
    with pytest.raises(RuntimeError, match=r"PyTorchDDPTrainer.fit: MLflow tracking needs"):
        PyTorchDDPTrainer(model(), num_gpus=2).fit(data()[0], mlflow_experiment="none")
    with pytest.raises(ValueError, match="experiment must be a non-empty name, got ''"):
        MLflowLogger("")
