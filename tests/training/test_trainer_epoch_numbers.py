"""One epoch numbering everywhere a run reports: the console lines, the final summary,
``metrics.jsonl``, the callbacks' logs and the History count epochs from 1."""
import json
import os
import re
import sys

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
LINE = re.compile(r"^(train|val|epoch) +step (\d+)/\d+ \| epoch (\d+) ")
SUMMARY = re.compile(r"^done: (\d+) steps, (\d+) epochs?(?: \(epoch (\d+) unfinished\))?, "
                     r"(?:.*best val_loss [0-9.]+ \(epoch (\d+)\))?")


class StepEpochs(Callback):
    def __init__(self):
        self.seen = []

    def on_step_end(self, trainer, logs):
        self.seen.append(logs["epoch"])


def run(tmp_path, capsys, **config):
    manual_seed(0)
    model = MLP([6, 8, 2])
    train, val = problem()
    callback = StepEpochs()
    # lr 2 with momentum: the validation loss is lowest in epoch 2 of 3
    settings = dict(epochs=3, seed=5, log_interval=4, metrics_dir=str(tmp_path),
                    progress_bar=False)
    settings.update(config)
    trainer = Trainer(model, SGD(model.parameters(), lr=2.0, momentum=0.9), F.cross_entropy,
                      TrainingConfig(**settings), callbacks=[callback])
    history = trainer.fit(DataLoader(train, batch_size=16, shuffle=True),
                          DataLoader(val, batch_size=16))
    out = capsys.readouterr().out.splitlines()
    lines = [LINE.match(line) for line in out if LINE.match(line)]
    summary = [SUMMARY.match(line) for line in out if line.startswith("done:")]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    return history, lines, summary, records, callback.seen


def test_console_summary_metrics_and_history_number_epochs_alike(tmp_path, capsys):
    history, lines, summary, records, step_epochs = run(tmp_path, capsys)
    console = [(m[1], int(m[2]), int(m[3])) for m in lines]
    assert console == [(r["kind"], r["step"], r["epoch"]) for r in records]
    assert [e for kind, _, e in console if kind == "epoch"] == [1, 2, 3]
    assert history["epoch"] == [1, 2, 3]
    assert step_epochs == [1] * 4 + [2] * 4 + [3] * 4  # 4 steps an epoch
    losses = history["val_loss"]
    assert history.best_epoch == history["epoch"][losses.index(min(losses))] == 2
    assert len(summary) == 1 and summary[0] is not None
    assert int(summary[0][2]) == 3 and summary[0][3] is None
    assert int(summary[0][4]) == history.best_epoch  # "best val_loss ... (epoch N)"


def test_a_run_stopped_inside_its_first_epoch_reports_epoch_one(tmp_path, capsys):
    history, lines, summary, records, step_epochs = run(tmp_path, capsys, max_steps=2,
                                                        log_interval=1)
    assert [int(m[3]) for m in lines] == [r["epoch"] for r in records] == [1, 1]
    assert step_epochs == [1, 1] and len(history) == 0
    # the console said "epoch 1": the summary names that epoch, unfinished, not "0 epochs"
    assert summary[0] is not None and summary[0].group(2, 3) == ("1", "1"), summary


def test_a_history_saved_with_epochs_from_0_loads_numbered_from_1():
    from neural_arch.training import History
    old = {"epochs": [{"epoch": 0, "train_loss": 1.0}, {"epoch": 1, "train_loss": 0.5}],
           "best": 0.5, "best_epoch": 1, "total_time": 2.0, "monitor": "train_loss",
           "samples": 64.0, "last_loss": 0.5}  # a checkpoint's, from before the numbering
    history = History("train_loss")
    history.load_state_dict(old)
    assert history["epoch"] == [1, 2] and history.best_epoch == 2
    again = History("train_loss")
    again.load_state_dict(history.state_dict())
    assert again["epoch"] == [1, 2] and again.best_epoch == 2
