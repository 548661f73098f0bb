"""The seed's ``DistributedConfig`` snippet at a size this machine runs (2 processes, one
node, the CPU's "gloo"), used by ``PyTorchDDPTrainer(model, config=config)``: it trains as
the same settings passed one by one do (losses equal), MLflow holds the run (read back with
MLflow's client), TensorBoard the scalars (read back frame by frame), checkpoints are kept
every ``checkpoint_frequency`` epochs and at the end; under a job whose size disagrees with
``num_gpus`` / ``gpus_per_node`` every rank refuses, naming the field."""
from __future__ import annotations

import functools

import numpy as np
import pytest

mlflow = pytest.importorskip("mlflow")
pytest.importorskip("tensorboardX")

from mlflow.tracking import MlflowClient  # noqa: E402
from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.distributed.checkpoint.directory import CheckpointDirectory  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.training import DistributedConfig, PyTorchDDPTrainer  # noqa: E402
from neural_arch.training.launching import fit_in_processes  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test
from tensorboard_events import event_files, scalars  # noqa: E402
import distributed_config_jobs as jobs  # noqa: E402

pytestmark = [pytest.mark.timeout(180), pytest.mark.slow]


@pytest.fixture
def tracking(tmp_path, monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


def test_the_seed_config_at_two_processes_trains_tracks_and_checkpoints(tmp_path, tracking):
    manual_seed(0)
    model = MLP([6, 8, 2])
    # ---- as in the seed, at this machine's size (8 GPUs on 2 nodes, nccl, 100 epochs there)
    config = DistributedConfig(
        # Resources
        num_gpus=2,
        num_nodes=1,
        gpus_per_node=2,

        # Backend
        backend="pytorch-ddp",  # or "horovod", "ray", "tensorflow"

        # Training
        batch_size=4,  # Per GPU
        epochs=3,
        learning_rate=0.1,

        # Optimization
        mixed_precision=False,  # FP16
        gradient_accumulation_steps=2,
        gradient_clipping=1.0,

        # Communication
        communication_backend="gloo",  # or "gloo", "mpi"
        find_unused_parameters=False,

        # Checkpointing
        checkpoint_frequency=2,  # Every 2 epochs
        checkpoint_dir="./checkpoints",

        # Monitoring
        mlflow_tracking=True,
        tensorboard=True,
        log_every_n_steps=1
    )
    # ----
    with mlflow.start_run(run_name="distributed-training") as run:
        history = PyTorchDDPTrainer(model, config=config, optimizer="sgd", verbose=False,
                                    progress_bar=False).fit(jobs.data())
    # the same settings, one by one, without tracking: the same losses
    manual_seed(0)
    reference = PyTorchDDPTrainer(
        MLP([6, 8, 2]), num_gpus=2, batch_size=4, epochs=3, learning_rate=0.1,
        gradient_accumulation_steps=2, max_grad_norm=1.0, backend="gloo", optimizer="sgd",
        verbose=False, progress_bar=False).fit(jobs.data())
    np.testing.assert_allclose(history["train_loss"], reference["train_loss"], rtol=1e-6)

    client = MlflowClient(tracking_uri=tracking)
    logged = client.get_run(run.info.run_id)
    params = logged.data.params
    assert (params["world_size"], params["max_grad_norm"], params["gradient_accumulation_steps"],
            params["log_interval"], params["save_every_epochs"]) == ("2", "1.0", "2", "1", "2")
    losses = [m.value for m in client.get_metric_history(run.info.run_id, "epoch/train_loss")]
    np.testing.assert_allclose(losses, history["train_loss"], rtol=1e-6)

    runs = list((tmp_path / "runs").iterdir())
    assert len(runs) == 1 and len(event_files(runs[0])) == 1, "one run, rank 0's file"
    board = scalars(runs[0])
    np.testing.assert_allclose([v for _, v in board["epoch/train_loss"]], history["train_loss"],
                               rtol=1e-6)
    # 32 rows / (2 ranks x 4) = 4 micro-batches an epoch, 2 steps: epochs end at 2, 4, 6
    assert [step for step, _ in board["epoch/train_loss"]] == [2, 4, 6]
    assert [step for step, _ in board["train/loss"]] == [1, 2, 3, 4, 5, 6]

    kept = [name.rsplit("/", 1)[-1] for name in
            CheckpointDirectory(str(tmp_path / "checkpoints")).list()]
    # after epochs 2 (every 2nd) and 3 (the end), not after epoch 1
    assert kept == ["ckpt-e000002-s00000004", "ckpt-e000003-s00000006"], kept


@pytest.mark.parametrize("fields, message", [
    ({"num_gpus": 4}, r"num_gpus=4.*2 ranks"),
    ({"num_gpus": 2, "gpus_per_node": 1, "num_nodes": 2}, r"gpus_per_node=1.*2 on this node"),
])
def test_a_job_of_another_size_is_refused_on_every_rank(fields, message):
    with pytest.raises(RuntimeError, match=message):
        fit_in_processes(functools.partial(jobs.make_trainer, **fields), jobs.data(),
                         num_processes=2, timeout=60)
