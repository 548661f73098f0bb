"""The Trainer's learning-rate schedules against their formulas, and its clipping against the
norm it promises."""
import json
import math

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.nn.parameter import Parameter
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig
from neural_arch.training.schedule import build_schedule

from trainer_job import problem

pytestmark = pytest.mark.timeout(120)
BASE = 0.2


def expected_lr(name, step, total, warmup, min_ratio):
    """The rate after ``step`` optimizer steps: linear warm-up from BASE / (warmup + 1) to
    BASE over ``warmup`` steps, then constant, cosine or linear decay to BASE * min_ratio."""
    if step < warmup:
        start = 1.0 / (warmup + 1)
        return BASE * (start + (1 - start) * step / warmup)
    k, span = step - warmup, max(1, total - warmup)
    low = BASE * min_ratio
    if name == "constant":
        return BASE
    if name == "cosine":
        return low + (BASE - low) * (1 + math.cos(math.pi * min(k, span) / span)) / 2
    return BASE * (1 + (min_ratio - 1) * min(k, span) / span)


@pytest.mark.parametrize("name", ["constant", "cosine", "linear"])
@pytest.mark.parametrize("warmup,min_ratio", [(0, 0.0), (3, 0.0), (4, 0.1)])
def test_build_schedule_follows_the_formula(name, warmup, min_ratio):
    total = 12
    optimizer = SGD([Parameter(np.zeros(2, np.float32))], lr=BASE)
    scheduler = build_schedule(optimizer, name, total, warmup, min_ratio)
    assert (scheduler is None) == (name == "constant" and warmup == 0)
    for step in range(total + 1):
        got = optimizer.param_groups[0]["lr"]
        assert got == pytest.approx(expected_lr(name, step, total, warmup, min_ratio),
                                    rel=1e-9, abs=1e-12), (name, step)
        if scheduler is not None:
            scheduler.step()


def test_trainer_logs_the_scheduled_rate_at_every_step(tmp_path):
    manual_seed(0)
    model = MLP([6, 8, 2])
    train, _ = problem()
    cfg = TrainingConfig(epochs=2, lr_schedule="cosine", warmup_steps=3, min_lr_ratio=0.1,
                         log_interval=1, metrics_dir=str(tmp_path), verbose=False, seed=1)
    trainer = Trainer(model, SGD(model.parameters(), lr=BASE), F.cross_entropy, cfg)
    trainer.fit(DataLoader(train, batch_size=8, shuffle=True))
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    train_lines = [line for line in lines if line["kind"] == "train"]
    total = 2 * (64 // 8)
    assert [line["step"] for line in train_lines] == list(range(1, total + 1))
    for line in train_lines:  # logged after the step: the rate the next step will use
        assert line["lr"] == pytest.approx(
            expected_lr("cosine", line["step"], total, 3, 0.1), rel=1e-9), line


def one_step_change(max_grad_norm):
    """How far one plain-SGD step of the Trainer moves the weights, and the gradient norm it
    logged (before clipping)."""
    manual_seed(0)
    model = MLP([6, 16, 2])
    before = np.concatenate([p.array.ravel().copy() for p in model.parameters()])
    train, _ = problem()
    cfg = TrainingConfig(epochs=1, max_grad_norm=max_grad_norm, log_interval=1, verbose=False,
                         seed=1)
    trainer = Trainer(model, SGD(model.parameters(), lr=BASE), F.cross_entropy, cfg)
    trainer.fit(DataLoader(train, batch_size=16, shuffle=True), max_steps=1)
    after = np.concatenate([p.array.ravel() for p in model.parameters()])
    return float(np.linalg.norm((after - before).astype(np.float64)))


def test_clipping_bounds_the_update_by_lr_times_the_norm():
    unclipped = one_step_change(None)
    assert unclipped > BASE * 0.05  # the gradient is larger than the limit below
    clipped = one_step_change(0.01)
    # SGD without momentum moves by lr * g; g clipped to norm 0.01 -> exactly lr * 0.01
    assert clipped == pytest.approx(BASE * 0.01, rel=1e-4)
    loose = one_step_change(1e6)  # a limit above the norm leaves the step alone
    assert loose == pytest.approx(unclipped, rel=1e-6)
