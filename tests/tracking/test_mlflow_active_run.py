"""The MLflow snippet users bring from DDP wrappers: the trainer built with
``mlflow_tracking=True`` inside ``with mlflow.start_run(...)``, then the script's own
``mlflow.log_param`` / ``log_metric`` after ``fit``. Real processes (2 ranks); the run is read
back with MLflow's client: one run, the script's own, holding the trainer's parameters and
metric histories and the script's values, ended by the ``with`` block."""
from __future__ import annotations

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")

from mlflow.tracking import MlflowClient  # noqa: E402
from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.data import TensorDataset  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.training import PyTorchDDPTrainer  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

pytestmark = pytest.mark.timeout(120)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    return TensorDataset(x, (x[:, 0] > 0).astype(np.int64))


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)  # MLflow's Default experiment keeps artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


def trainer(**extra):
    manual_seed(0)
    return PyTorchDDPTrainer(MLP([6, 8, 2]), num_gpus=2, batch_size=4, epochs=2,
                             optimizer="sgd", learning_rate=0.1, verbose=False,
                             progress_bar=False, **extra)


@pytest.mark.slow
def test_the_trainer_logs_into_the_run_the_script_opened(tracking):
    with mlflow.start_run(run_name="distributed-training") as run:
        history = trainer(mlflow_tracking=True).fit(data())
        mlflow.log_param("num_gpus", 2)
        mlflow.log_metric("throughput", 123.0)
        assert mlflow.active_run().info.run_id == run.info.run_id  # still the script's run
    client = MlflowClient(tracking_uri=tracking)
    runs = client.search_runs([run.info.experiment_id])
    assert [r.info.run_id for r in runs] == [run.info.run_id], "one run: the script's"
    logged = client.get_run(run.info.run_id)
    assert logged.info.status == "FINISHED" and logged.info.run_name == "distributed-training"
    assert logged.data.params["world_size"] == "2" and logged.data.params["num_gpus"] == "2"
    assert logged.data.metrics["throughput"] == 123.0
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "epoch/train_loss")]
    np.testing.assert_allclose(losses, history["train_loss"], rtol=1e-6)


def test_mlflow_tracking_must_be_a_bool():
    with pytest.raises(TypeError, match="mlflow_tracking must be a bool, got 'yes'"):
        trainer(mlflow_tracking="yes")
