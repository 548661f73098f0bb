"""The train functions the tuner tests hand to trial processes: importable there, so they live
in a module. Each leaves ``pid_<rank>`` in its trial's directory (so a test can check that
the processes are gone) and ``finished_<rank>`` when it ran to its end. ``run_two_rank_trials``
is the run and check of two-process trials that both backends' tests share."""
from __future__ import annotations

import os
import time

import numpy as np

from neural_arch import tune

TARGET = 0.3


def expected_loss(x: float, step: int) -> float:
    """What ``curve`` reports at ``step``: the distance to TARGET plus a decaying term."""
    return (x - TARGET) ** 2 + 1.0 / (step + 1)


def _mark(name: str) -> None:
    rank = int(os.environ.get("RANK", "0"))
    with open(os.path.join(tune.trial_dir(), f"{name}_{rank}"), "w") as handle:
        handle.write(str(os.getpid()))


def _all_started(processes: int, timeout: float = 60.0) -> None:
    """Wait until the trial's ``processes`` processes each left their pid: a trial pruned at
    its first steps then has them all to stop, which is what the tests check (a slow machine
    may start the second process after the first reported twice)."""
    directory, deadline = tune.trial_dir(), time.monotonic() + timeout
    while True:
        started = sorted(name for name in os.listdir(directory) if name.startswith("pid_"))
        if len(started) >= processes:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"{processes} processes of the trial in {directory} did not "
                               f"start within {timeout} s: only {started}")
        time.sleep(0.01)


def curve(config):
    """``config["steps"]`` reports of ``expected_loss``, ``config["sleep"]`` seconds apart,
    once each of the trial's ``config["processes"]`` processes (default 1) started."""
    _mark("pid")
    _all_started(config.get("processes", 1))
    for step in range(config["steps"]):
        tune.report(loss=expected_loss(config["x"], step), step=step)
        time.sleep(config["sleep"])
    _mark("finished")


def failing_curve(config):
    """``curve`` without its wait, except that a config with x above 0.5 raises at its second
    step."""
    _mark("pid")
    for step in range(config["steps"]):
        if step == 1 and config["x"] > 0.5:
            raise ValueError(f"x={config['x']} is too large")
        tune.report(loss=expected_loss(config["x"], step), step=step)
        time.sleep(config["sleep"])
    _mark("finished")


def two_rank_sum(config):
    """Both ranks of the trial all-reduce their share; rank 0 returns the total, so a trial
    whose ranks did not form one job cannot return it."""
    from neural_arch import distributed as dist
    _mark("pid")
    dist.init_process_group("auto", timeout=30)
    try:
        share = np.array([config["x"] * (dist.get_rank() + 1)])
        dist.all_reduce(share)
        tune.report(loss=float(share[0]), world=dist.get_world_size())
    finally:
        dist.destroy_process_group()
    _mark("finished")
    return {"loss": float(share[0])}


def run_two_rank_trials(tmp_path, **settings):
    """Two trials of ``two_rank_sum`` (x = 1, then 2) of two processes each, checked: each is
    one job whose loss is the sum over its ranks, and both of its ranks ran to their end."""
    results = tune.DistributedTuner(
        two_rank_sum, {"x": tune.choice([1.0, 2.0])}, num_samples=2, processes_per_trial=2,
        local_dir=str(tmp_path), points_to_evaluate=[{"x": 1.0}, {"x": 2.0}], **settings).tune()
    rows = [(row["state"], row["loss"]) for row in results]
    assert rows == [("COMPLETE", 3.0), ("COMPLETE", 6.0)], rows
    for row in results:
        assert row["last_report"] == {"loss": row["loss"], "world": 2.0}, row
        finished = sorted(n for n in os.listdir(row["dir"]) if n.startswith("finished"))
        assert finished == ["finished_0", "finished_1"], (row, finished)
    return results


def digits_mlp(config):
    """A small MLP trained by the Trainer on a synthetic digits-like problem; the validation
    loss of each epoch is reported (``TuneReportCallback``)."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader, TensorDataset
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    rng = np.random.default_rng(0)
    x = rng.normal(size=(96, 8)).astype(np.float32)
    y = (x[:, 0] + x[:, 1] > 0).astype(np.int64)
    manual_seed(0)
    model = MLP([8, config["hidden"], 2])
    trainer = Trainer(model, SGD(model.parameters(), lr=config["lr"]), F.cross_entropy,
                      TrainingConfig(epochs=3, verbose=False, progress_bar=False),
                      callbacks=[tune.TuneReportCallback(metrics={"loss": "val_loss"})])
    trainer.fit(DataLoader(TensorDataset(x[:64], y[:64]), batch_size=16, shuffle=True),
                DataLoader(TensorDataset(x[64:], y[64:]), batch_size=16))
