"""What ``train_fn`` calls inside a trial: ``report`` and ``trial_dir``.

A trial's processes are started by ``DistributedTuner``; each runs ``train_fn(config)`` with
this module's context set (``TrialRecipe``). ``report`` is called by every rank alike, and
rank 0's values are the trial's: they are appended to ``reports.jsonl`` in the trial's
directory, one JSON line each, which the tuner reads while the trial runs (to feed its
pruner) and stops the trial's processes when the pruner says so. In a Ray Tune trial
(``backend="ray"``) rank 0's reports also go to Ray Tune's ``report`` (``forward``). Nothing
here imports Optuna: the trial processes never need it.
"""
from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional

REPORTS_FILE = "reports.jsonl"
# receives each of rank 0's reports (values, step) as well: Ray Tune's report, in a Ray trial
Forward = Callable[[Dict[str, float], int], None]


@dataclass
class TrialContext:
    number: int           # the trial's number in its study
    directory: str        # the trial's own directory (its logs, reports, checkpoints)
    rank: int
    world_size: int
    reports: int = field(default=0)  # reports made so far (the default step of the next)
    forward: Optional[Forward] = None
    last_step: Optional[int] = None  # the step of the latest report


_context: Optional[TrialContext] = None


def start(context: TrialContext) -> None:
    global _context
    _context = context


def end() -> None:
    global _context
    _context = None


def _current(what: str) -> TrialContext:
    if _context is None:
        raise RuntimeError(f"neural_arch.tune.{what}() is called inside a train_fn that "
                           f"DistributedTuner runs as a trial; this process runs no trial")
    return _context


def trial_dir() -> str:
    """This trial's directory: a place for its checkpoints and files (shared by its ranks)."""
    return _current("trial_dir").directory


def trial_number() -> int:
    return _current("trial_number").number


def _clean(values: Mapping[str, Any]) -> Dict[str, float]:
    clean = {}
    for key, value in values.items():
        if not isinstance(key, str):
            raise TypeError(f"neural_arch.tune.report: metric names must be str, got {key!r}")
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            try:  # a NumPy scalar or a 0-d array
                value = float(value)
            except (TypeError, ValueError):
                raise TypeError(f"neural_arch.tune.report: {key}={value!r} is not a "
                                f"number") from None
        clean[key] = float(value)
    return clean


def report(metrics: Optional[Mapping[str, Any]] = None, *, step: Optional[int] = None,
           **values: Any) -> None:
    """Report the trial's intermediate results: ``report(loss=0.3, step=5)`` or
    ``report({"loss": 0.3})``. ``step`` (default: the number of earlier reports) is the
    resource the pruner compares trials at, an epoch or an optimizer step, increasing."""
    context = _current("report")
    merged = dict(metrics or {})
    merged.update(values)
    if not merged:
        raise ValueError("neural_arch.tune.report: no metric given; e.g. report(loss=0.3)")
    clean = _clean(merged)
    if step is None:
        step = context.reports
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"neural_arch.tune.report: step must be an int >= 0, got {step!r}")
    context.reports += 1
    context.last_step = step
    if context.rank != 0:
        return
    record = {"step": step, "time": time.time(),
              "values": {k: (v if math.isfinite(v) else None) for k, v in clean.items()}}
    path = os.path.join(context.directory, REPORTS_FILE)
    # one write of one whole line: the tuner reads only lines that end in a newline
    with open(path, "a", encoding="utf-8") as handle:
        handle.write(json.dumps(record) + "\n")
    if context.forward is not None:
        context.forward(clean, step)
