"""Where the numbers of a run go: ``metrics.jsonl`` (always) and TensorBoard (when
``tensorboardX`` is installed). Only the writing rank (rank 0) makes one.

Each line of ``metrics.jsonl`` is one JSON object with ``kind`` ("train", "val" or "epoch"),
``step`` (optimizer steps so far), ``epoch`` (numbered from 1, as the console shows it) and
``time`` (seconds since the run started, continued across resumes). "train" lines also carry
``loss``, ``lr``, ``grad_norm``, ``samples_per_second``, ``tokens_per_second`` (when the
sample length is known; both over the interval's steps, the run's first step left out as
set-up), ``comm_seconds`` (gradient communication the steps waited for in the interval) and
``comm_hidden_seconds`` (gradient communication that ran hidden under backward); "val" lines
``val_loss`` and ``val_accuracy``; "epoch" lines the epoch record of the history.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Dict, Optional, Sequence

METRICS_FILE = "metrics.jsonl"


def _clean(value: Any) -> Any:
    """JSON has no NaN/inf: such values are written as null."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class MetricsLogger:
    def __init__(self, directory: str, append: bool = False) -> None:
        os.makedirs(directory, exist_ok=True)
        self.path = os.path.join(directory, METRICS_FILE)
        # line-buffered: a crash loses at most the line being written
        self._file = open(self.path, "a" if append else "w", encoding="utf-8", buffering=1)
        self._board: Optional[Any] = None
        try:
            from tensorboardX import SummaryWriter  # optional: the dev extra installs it
        except ImportError:
            SummaryWriter = None
        if SummaryWriter is not None:
            self._board = SummaryWriter(logdir=os.path.join(directory, "tensorboard"))

    def log(self, kind: str, step: int, values: Dict[str, Any]) -> None:
        record = {"kind": kind, "step": int(step)}
        record.update({k: _clean(v) for k, v in values.items()})
        self._file.write(json.dumps(record) + "\n")
        if self._board is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool) \
                        and key not in ("epoch", "time") and math.isfinite(value):
                    self._board.add_scalar(f"{kind}/{key}", value, step)

    def close(self) -> None:
        self._file.close()
        if self._board is not None:
            self._board.close()


def epoch_record(finished: int, sums: Sequence[float], seconds: float,
                 steps: int) -> Dict[str, Any]:
    """The history record of the epoch that follows ``finished`` earlier ones (the loop's count,
    from 0), numbered from 1 as every record and line is; from its (loss * samples, samples)
    summed over the ranks; validation fields None until an evaluation fills them."""
    return {"epoch": finished + 1, "train_loss": float(sums[0] / max(sums[1], 1)), "val_loss": None,
            "val_accuracy": None, "seconds": seconds,
            "samples_per_second": float(sums[1] / seconds) if seconds else None, "steps": steps}


def write_record(logger: Optional[MetricsLogger], bar: Any, kind: str, step: int,
                 values: Dict[str, Any], elapsed: float) -> None:
    """One record into metrics.jsonl (rank 0's logger; None elsewhere) and the progress line."""
    if logger is not None:
        logger.log(kind, step, dict(values, time=round(elapsed, 3)))
    bar.line(kind, step, values)
