"""``TensorBoardLogger``: a Trainer callback that writes TensorBoard event files with
``tensorboardX``, written by rank 0 only (``pip install 'neural-arch[tensorboard]'``).

What it writes: the numbers of each logging interval (``train/loss``, ``train/lr``,
``train/grad_norm``, ``train/samples_per_second``, ... at the optimizer step) and of each epoch
record (``epoch/train_loss``, ``epoch/val_loss``, ``epoch/val_accuracy``, ... at the step the
epoch ended): the names and steps ``MLflowLogger`` uses. ``tensorboard --logdir`` reads them.

Where: ``log_dir`` itself when given (as torch's ``SummaryWriter(log_dir)``), else
``runs/<date>_<time>_<host>`` under the working directory of the process that builds the
logger (torch's default). The path is resolved there, so that workers started elsewhere write
into the same folder. Each ``fit`` adds one event file; a resumed run adds its own beside the
first, and TensorBoard shows them as one run. Events are flushed at every epoch's end, so a
crash loses at most the intervals of the epoch it interrupted.

The other ranks build the callback alike and write nothing.
"""
from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Dict, Optional

from .callbacks import Callback
from .tracking_common import require_package, tagged_numbers



def require_tensorboardx(owner: str) -> None:
    """RuntimeError naming the extra to install when tensorboardX is missing; called where the
    logger is asked for, before any worker process starts."""
    require_package("tensorboardX", owner, "TensorBoard event files need", "tensorboard")


def default_log_dir() -> str:
    """torch's ``SummaryWriter()`` folder: ``runs/<Mon>DD_HH-MM-SS_<host>``, here absolute."""
    stamp = datetime.datetime.now().strftime("%b%d_%H-%M-%S")
    return os.path.abspath(os.path.join("runs", f"{stamp}_{socket.gethostname()}"))


class TensorBoardLogger(Callback):
    def __init__(self, log_dir: Optional[str] = None) -> None:
        if log_dir is not None and (not isinstance(log_dir, (str, os.PathLike))
                                    or not str(log_dir)):
            raise ValueError(f"TensorBoardLogger: log_dir must be a folder path, got "
                             f"{log_dir!r}")
        require_tensorboardx("TensorBoardLogger")
        self.log_dir = default_log_dir() if log_dir is None else os.path.abspath(log_dir)
        self._writer: Any = None

    def on_fit_start(self, trainer: Any) -> None:
        if not trainer.is_logger:
            return
        from tensorboardX import SummaryWriter
        os.makedirs(self.log_dir, exist_ok=True)
        self._writer = SummaryWriter(logdir=self.log_dir)

    def on_step_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        self._write(tagged_numbers(logs, "train"), trainer.step)

    def on_epoch_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        self._write(tagged_numbers(logs, "epoch"), trainer.step)
        if self._writer is not None:
            self._writer.flush()

    def on_fit_end(self, trainer: Any, history: Any) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def _write(self, values: Dict[str, float], step: int) -> None:
        if self._writer is None:
            return
        for tag, value in values.items():
            self._writer.add_scalar(tag, value, step)

    def __getstate__(self) -> Dict[str, Any]:
        # sent to the workers before any fit: a writer never travels
        return dict(self.__dict__, _writer=None)
