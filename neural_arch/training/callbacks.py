"""Hooks into ``Trainer.fit`` and the ``History`` it returns.

A callback sees the trainer and a dict of the numbers just measured; it stops training by
setting ``trainer.should_stop``. Callbacks run on every rank with the same (rank-averaged)
numbers, so a decision to stop is taken by all ranks at the same step.
"""
from __future__ import annotations

import math
from typing import Any, Dict, List, Optional


class Callback:
    def on_fit_start(self, trainer: Any) -> None: ...
    def on_step_end(self, trainer: Any, logs: Dict[str, Any]) -> None: ...
    def on_epoch_end(self, trainer: Any, logs: Dict[str, Any]) -> None: ...
    def on_fit_end(self, trainer: Any, history: "History") -> None: ...


class EarlyStopping(Callback):
    """Stop when ``monitor`` (an epoch record's key) has not improved by more than
    ``min_delta`` for ``patience`` epochs."""

    def __init__(self, monitor: str = "val_loss", patience: int = 3,
                 min_delta: float = 0.0) -> None:
        if patience < 1:
            raise ValueError(f"EarlyStopping patience must be >= 1, got {patience}")
        self.monitor, self.patience, self.min_delta = monitor, int(patience), float(min_delta)
        self.best, self.bad_epochs = math.inf, 0

    def on_epoch_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        value = logs.get(self.monitor)
        if value is None:  # e.g. no validation data: fall back to the training loss
            value = logs.get("train_loss")
        if value is None or value != value:
            return
        if value < self.best - self.min_delta:
            self.best, self.bad_epochs = value, 0
            return
        self.bad_epochs += 1
        if self.bad_epochs >= self.patience:
            trainer.should_stop = True

    def state_dict(self) -> Dict[str, Any]:
        return {"best": self.best if math.isfinite(self.best) else None,
                "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self.best = math.inf if state.get("best") is None else float(state["best"])
        self.bad_epochs = int(state.get("bad_epochs", 0))


class History:
    """What ``fit`` returns: one record per epoch (``epoch``, ``train_loss``, ``val_loss``,
    ``val_accuracy``, ``seconds``, ``samples_per_second``, ``steps``), the ``best`` monitored
    value and its ``best_epoch``, ``total_time`` and whether training ``stopped_early``.
    ``history["train_loss"]`` is the list of one key over the epochs. Epochs are numbered from
    1 (``epoch`` and ``best_epoch``), as the console and ``metrics.jsonl`` number them."""

    def __init__(self, monitor: str = "val_loss") -> None:
        self.monitor = monitor
        self.epochs: List[Dict[str, Any]] = []
        self.best: Optional[float] = None
        self.best_epoch: Optional[int] = None
        self.total_time = 0.0
        self.stopped_early = False
        self.steps = 0
        self.samples = 0.0  # training samples over all ranks, resumed runs included
        self.last_loss: Optional[float] = None  # the latest interval's training loss

    def append(self, record: Dict[str, Any]) -> None:
        self.epochs.append(dict(record))
        value = record.get(self.monitor)
        if value is None:
            value = record.get("train_loss")
        if value is not None and value == value and (self.best is None or value < self.best):
            self.best, self.best_epoch = float(value), int(record["epoch"])

    @property
    def best_accuracy(self) -> Optional[float]:
        values = [r["val_accuracy"] for r in self.epochs if r.get("val_accuracy") is not None]
        return max(values) if values else None

    def __getitem__(self, key: str) -> List[Any]:
        return [record.get(key) for record in self.epochs]

    def __len__(self) -> int:
        return len(self.epochs)

    def state_dict(self) -> Dict[str, Any]:
        return {"epochs": self.epochs, "best": self.best, "best_epoch": self.best_epoch,
                "total_time": self.total_time, "monitor": self.monitor,
                "samples": self.samples, "last_loss": self.last_loss, "first_epoch": 1}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        # checkpoints written before epochs were numbered from 1 lack "first_epoch"
        shift = 1 - int(state.get("first_epoch", 0))
        self.epochs = [dict(r, epoch=r["epoch"] + shift) for r in state["epochs"]]
        self.best = state["best"]
        self.best_epoch = None if state["best_epoch"] is None else state["best_epoch"] + shift
        self.total_time = float(state["total_time"])
        self.samples, self.last_loss = float(state["samples"]), state["last_loss"]

    def __repr__(self) -> str:
        return (f"History(epochs={len(self.epochs)}, steps={self.steps}, best={self.best}, "
                f"best_epoch={self.best_epoch}, total_time={self.total_time:.2f}s)")
