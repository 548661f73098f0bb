"""``TuneReportCallback``: a Trainer inside a trial reports each epoch to the tuner.

``metrics`` names what to report: a dict of reported name -> key of the epoch record
(``{"loss": "val_loss"}``, as Ray Tune's callback spells it), a list of keys reported under
their own names, or None for every number of the record. The step is the epoch's number (from
1). Every rank runs the callback with the same numbers; rank 0's report is the trial's.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Sequence, Union

from ..training.callbacks import Callback
from .session import report

_NOT_METRICS = ("epoch", "steps", "seconds")


class TuneReportCallback(Callback):
    def __init__(self, metrics: Optional[Union[Mapping[str, str], Sequence[str]]] = None) -> None:
        if isinstance(metrics, str):
            metrics = [metrics]
        self.metrics = None if metrics is None else (
            dict(metrics) if isinstance(metrics, Mapping) else {key: key for key in metrics})

    def on_epoch_end(self, trainer: Any, logs: Dict[str, Any]) -> None:
        if self.metrics is None:
            chosen = {k: v for k, v in logs.items() if k not in _NOT_METRICS}
        else:
            chosen = {name: logs.get(key) for name, key in self.metrics.items()}
        values = {k: v for k, v in chosen.items()
                  if isinstance(v, (int, float)) and not isinstance(v, bool)}
        if values:  # a key the epoch lacks (no validation data: no val_loss) is left out
            report(values, step=int(logs["epoch"]))
