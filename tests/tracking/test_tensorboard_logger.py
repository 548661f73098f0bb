"""TensorBoard event files of ``PyTorchDDPTrainer(tensorboard_dir=...)`` / ``tensorboard=True``
and of the ``TensorBoardLogger`` callback, written with the real tensorboardX and read back
frame by frame (``tensorboard_events``): the scalars equal the History's epoch losses and the
interval losses of ``metrics.jsonl``; in a job of 2 processes only rank 0 writes."""
from __future__ import annotations

import json
import os
import socket

import numpy as np
import pytest

pytest.importorskip("tensorboardX")

from neural_arch.core import manual_seed  # noqa: E402
from neural_arch.data import DataLoader, TensorDataset  # noqa: E402
from neural_arch.models import MLP  # noqa: E402
from neural_arch.training import PyTorchDDPTrainer  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test
from tensorboard_events import event_files, scalars  # noqa: E402

pytestmark = pytest.mark.timeout(120)


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(32, 6)).astype(np.float32)
    return TensorDataset(x, (x[:, 0] > 0).astype(np.int64))


def interval_losses(metrics_dir):
    lines = [json.loads(line) for line in open(os.path.join(metrics_dir, "metrics.jsonl"))]
    return [(r["step"], r["loss"]) for r in lines if r["kind"] == "train"]


def test_the_seed_tensorboard_snippet_writes_the_epoch_losses(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manual_seed(0)
    model = MLP([6, 8, 2])
    # ---- as in the seed
    trainer = PyTorchDDPTrainer(
        model=model,
        tensorboard_dir="./runs",
        log_every_n_steps=10
    )
    # ----
    history = trainer.fit(DataLoader(data(), batch_size=2))
    board = scalars(tmp_path / "runs")
    assert [v for _, v in board["epoch/train_loss"]] == pytest.approx(history["train_loss"],
                                                                     rel=1e-6)
    assert [step for step, _ in board["train/loss"]] == [10, 16]  # 16 steps, and the last
    assert "train/lr" in board and "train/grad_norm" in board


@pytest.mark.slow
def test_two_processes_write_one_event_file_holding_the_losses(tmp_path):
    manual_seed(0)
    trainer = PyTorchDDPTrainer(MLP([6, 8, 2]), num_gpus=2, batch_size=4, epochs=2,
                                optimizer="sgd", learning_rate=0.1, verbose=False,
                                progress_bar=False, log_every_n_steps=2,
                                metrics_dir=str(tmp_path / "metrics"),
                                tensorboard_dir=str(tmp_path / "board"))
    history = trainer.fit(data())
    assert len(event_files(tmp_path / "board")) == 1, "rank 0 alone writes"
    board = scalars(tmp_path / "board")
    reference = interval_losses(tmp_path / "metrics")
    assert [step for step, _ in board["train/loss"]] == [step for step, _ in reference]
    np.testing.assert_allclose([v for _, v in board["train/loss"]],
                               [v for _, v in reference], rtol=1e-6)
    np.testing.assert_allclose([v for _, v in board["epoch/train_loss"]],
                               history["train_loss"], rtol=1e-6)
    assert [step for step, _ in board["epoch/train_loss"]] == [4, 8]  # 32 rows / (2 x 4)


def test_tensorboard_true_writes_under_runs_as_torch_does(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    manual_seed(0)
    history = PyTorchDDPTrainer(MLP([6, 8, 2]), batch_size=8, tensorboard=True,
                                verbose=False, progress_bar=False).fit(data())
    runs = os.listdir(tmp_path / "runs")
    assert len(runs) == 1 and runs[0].endswith("_" + socket.gethostname()), runs
    board = scalars(tmp_path / "runs" / runs[0])
    assert [v for _, v in board["epoch/train_loss"]] == pytest.approx(history["train_loss"],
                                                                     rel=1e-6)


def test_contradictory_or_misspelt_tensorboard_settings_are_refused(tmp_path):
    with pytest.raises(ValueError, match=r"tensorboard=False.*tensorboard_dir="):
        PyTorchDDPTrainer(MLP([6, 8, 2]), tensorboard=False, tensorboard_dir=str(tmp_path))
    with pytest.raises(TypeError, match="tensorboard must be a bool, got 'yes'"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), tensorboard="yes")
    with pytest.raises(ValueError, match=r"log_every_n_steps=5.*log_interval=3"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), log_every_n_steps=5, log_interval=3)
    with pytest.raises(ValueError, match="writes there already"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), metrics_dir=str(tmp_path),
                          tensorboard_dir=str(tmp_path / "tensorboard"))
