"""The logged samples/s and tokens/s measure training steps: the first interval's rate leaves
out what precedes the first step and the first step itself (set-up, compilation), so it is not
dragged down next to the later intervals."""
import json
import os
import sys
import time

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Callback, Trainer, TrainingConfig

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_job import problem  # noqa: E402

pytestmark = pytest.mark.timeout(60)
SET_UP_SECONDS = 1.0  # some hundred times a step of this tiny model


class SlowFitStart(Callback):
    def on_fit_start(self, trainer):
        time.sleep(SET_UP_SECONDS)


class SlowFirstLoss:
    """cross_entropy whose first call sleeps, as a first step that compiles its kernels does."""

    def __init__(self):
        self.calls = 0

    def __call__(self, output, target):
        self.calls += 1
        if self.calls == 1:
            time.sleep(SET_UP_SECONDS)
        return F.cross_entropy(output, target)


def train_records(tmp_path, loss_fn, callbacks=(), log_interval=8):
    manual_seed(0)
    model = MLP([6, 8, 2])
    train, _ = problem()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), loss_fn,
                      TrainingConfig(epochs=2, log_interval=log_interval, tokens_per_sample=3,
                                     metrics_dir=str(tmp_path), verbose=False),
                      callbacks=list(callbacks))
    trainer.fit(DataLoader(train, batch_size=4))  # 16 steps an epoch
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if r["kind"] == "train"]


@pytest.mark.parametrize("slow", ["fit_start", "first_step"])
def test_the_first_interval_rate_leaves_out_the_set_up(tmp_path, slow):
    if slow == "fit_start":
        records = train_records(tmp_path, F.cross_entropy, [SlowFitStart()])
    else:
        records = train_records(tmp_path, SlowFirstLoss())
    assert len(records) == 4
    rates = [r["samples_per_second"] for r in records]
    # 8 steps of 4 samples: with the second of set-up in it the first rate is < 32/s, about
    # a hundredth of the others; a factor of 10 leaves room for a busy machine
    assert rates[0] > np.median(rates[1:]) / 10, rates
    for record in records:
        assert record["tokens_per_second"] == pytest.approx(3 * record["samples_per_second"])


def test_a_first_interval_of_one_step_still_has_a_rate(tmp_path):
    records = train_records(tmp_path, F.cross_entropy, log_interval=1)
    assert len(records) == 32
    assert all(np.isfinite(r["samples_per_second"]) and r["samples_per_second"] > 0
               for r in records)
