"""Trainer: the same history at one and two processes, early stopping, resume equal to an
uninterrupted run, gradient accumulation equal to the big batch."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig

from launcher_support import free_port
from repo_paths import REPO_ROOT

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_job import problem  # noqa: E402

pytestmark = pytest.mark.timeout(240)


def fit(tmp_path=None, batch=8, epochs=3, lr=0.1, resume=False, max_steps=None, **config):
    manual_seed(0)
    model = MLP([6, 16, 2])
    train, val = problem()
    cfg = TrainingConfig(epochs=epochs, seed=5, verbose=False, resume=resume,
                         checkpoint_dir=None if tmp_path is None else str(tmp_path), **config)
    trainer = Trainer(model, SGD(model.parameters(), lr=lr, momentum=0.9), F.cross_entropy, cfg)
    history = trainer.fit(DataLoader(train, batch_size=batch, shuffle=True),
                          DataLoader(val, batch_size=8), max_steps=max_steps)
    return history, {n: p.array.copy() for n, p in model.named_parameters()}


def assert_same_weights(a, b, **tol):
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_allclose(a[name], b[name], err_msg=name, **tol)


def test_history_has_the_documented_fields():
    history, _ = fit()
    assert len(history) == 3 and history.steps == 24
    for record in history.epochs:
        assert set(record) == {"epoch", "train_loss", "val_loss", "val_accuracy", "seconds",
                               "samples_per_second", "steps"}
    assert history.best == min(history["val_loss"])
    assert history.best_epoch == int(np.argmin(history["val_loss"])) + 1  # counted from 1
    assert history["train_loss"][-1] < history["train_loss"][0]


def run_job(tmp_path, nproc, global_batch):
    out = tmp_path / f"p{nproc}.json"
    script = os.path.join(HERE, "trainer_job.py")
    if nproc == 1:
        cmd = [sys.executable, script, str(out), str(global_batch)]
    else:
        cmd = [sys.executable, "-m", "neural_arch.distributed.launcher",
               f"--nproc_per_node={nproc}", f"--master_port={free_port()}", script, str(out),
               str(global_batch)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), HERE]))
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=200, cwd=REPO_ROOT,
                            env=env)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    with open(out) as handle:
        return json.load(handle)


def test_two_processes_give_the_history_of_one(tmp_path):
    one, two = run_job(tmp_path, 1, 8), run_job(tmp_path, 2, 8)
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose([r[key] for r in two["history"]["epochs"]],
                                   [r[key] for r in one["history"]["epochs"]], rtol=1e-5,
                                   err_msg=key)
    for name in one["weights"]:
        np.testing.assert_allclose(two["weights"][name], one["weights"][name], rtol=1e-4,
                                   atol=1e-6, err_msg=name)


def test_early_stopping_stops():
    # lr 0: the validation loss never improves, so patience 2 ends the run after epoch 3
    history, _ = fit(epochs=10, lr=0.0, early_stopping_patience=2)
    assert history.stopped_early and len(history) == 3
    assert history.best_epoch == 1


def test_resume_equals_an_uninterrupted_run(tmp_path):
    whole, whole_weights = fit(tmp_path / "whole")
    # stop inside epoch 2 (8 steps per epoch), then resume from that checkpoint
    first, _ = fit(tmp_path / "split", max_steps=11)
    assert first.steps == 11 and len(first) == 1
    resumed, resumed_weights = fit(tmp_path / "split", resume=True)
    assert resumed.steps == whole.steps
    for key in ("train_loss", "val_loss"):
        np.testing.assert_allclose(resumed[key], whole[key], rtol=1e-6, err_msg=key)
    assert_same_weights(resumed_weights, whole_weights, rtol=1e-6)



def test_resuming_a_run_that_reached_max_steps_trains_no_further(tmp_path):
    first, first_weights = fit(tmp_path, max_steps=11)
    again, again_weights = fit(tmp_path, resume=True, max_steps=11)
    assert again.steps == first.steps == 11
    assert_same_weights(again_weights, first_weights, rtol=0)


def test_gradient_accumulation_equals_the_big_batch():
    big, big_weights = fit(batch=8, epochs=2)
    small, small_weights = fit(batch=4, epochs=2, gradient_accumulation_steps=2)
    assert small.steps == big.steps
    np.testing.assert_allclose(small["train_loss"], big["train_loss"], rtol=1e-5)
    assert_same_weights(small_weights, big_weights, rtol=1e-5, atol=1e-7)


def test_a_trainer_that_ended_its_own_group_refuses_a_second_fit():
    manual_seed(0)
    model = MLP([6, 16, 2])
    train, _ = problem()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      TrainingConfig(verbose=False))
    trainer.fit(DataLoader(train, batch_size=8))
    with pytest.raises(RuntimeError, match="make a new Trainer"):
        trainer.fit(DataLoader(train, batch_size=8))
