"""``TuneResults``: what ``DistributedTuner.tune()`` returns, read from the study.

``trials`` is the table: one dict per trial of the study (those of earlier, interrupted
tuners included), with ``trial`` (its number), ``state`` ("COMPLETE", "PRUNED", "FAIL",
"RUNNING", "WAITING"), ``config``, the metric's value (the final one; for a pruned trial the
last one reported), ``steps`` (reports the pruner saw), ``last_step``, the other metrics of
the last report (``last_report``), ``error`` (why it failed), ``seconds`` and ``dir``.
``best_config`` and ``best_result`` are those of the best finished trial. ``plot()`` draws
every trial's reported curve into one PNG. The Ray backend builds the same table from its
trials' directories (``ray_results``).
"""
from __future__ import annotations

import os
from typing import Any, Dict, Iterator, List, Mapping, Optional, Tuple

from .study import RETRY_OF, config_of


class TuneResults:
    def __init__(self, rows: List[Dict[str, Any]], curves: Mapping[int, List[Tuple[int, float]]],
                 metric: str, mode: str, study_name: str, study_dir: str) -> None:
        self.metric, self.mode, self.study_dir = metric, mode, study_dir
        self.study_name = study_name
        self.trials: List[Dict[str, Any]] = list(rows)
        self._curves = dict(curves)
        complete = [row for row in self.trials
                    if row["state"] == "COMPLETE" and row[metric] is not None]
        pick = min if mode == "min" else max
        self.best_result: Optional[Dict[str, Any]] = (
            pick(complete, key=lambda row: row[metric]) if complete else None)

    @classmethod
    def from_study(cls, study: Any, metric: str, mode: str, constants: Mapping[str, Any],
                   study_dir: str) -> "TuneResults":
        """The table of an Optuna study (the default backend)."""
        trials = study.get_trials(deepcopy=False)
        rerun = {int(t.user_attrs[RETRY_OF]): t.number for t in trials
                 if RETRY_OF in t.user_attrs}
        rows = [_row(t, metric, constants, rerun) for t in trials]
        curves = {t.number: sorted(t.intermediate_values.items()) for t in trials}
        return cls(rows, curves, metric, mode, study.study_name, study_dir)

    @property
    def best_config(self) -> Optional[Dict[str, Any]]:
        return None if self.best_result is None else dict(self.best_result["config"])

    def count(self, state: str) -> int:
        return sum(1 for row in self.trials if row["state"] == state)

    def __iter__(self) -> Iterator[Dict[str, Any]]:
        return iter(self.trials)

    def __len__(self) -> int:
        return len(self.trials)

    def __repr__(self) -> str:
        states = ", ".join(f"{self.count(s)} {s.lower()}" for s in ("COMPLETE", "PRUNED", "FAIL")
                           if self.count(s))
        best = "none" if self.best_result is None else \
            f"{self.metric}={self.best_result[self.metric]:.6g} {self.best_config}"
        return f"TuneResults({len(self)} trials: {states}; best {best})"

    def plot(self, path: Optional[str] = None) -> str:
        """Every trial's reported ``metric`` against its step, into a PNG (default:
        ``curves.png`` in the study's directory): finished trials solid, pruned ones dashed,
        failed ones dotted, the best thick. Needs matplotlib."""
        try:
            import matplotlib
        except ImportError:
            raise RuntimeError("TuneResults.plot needs matplotlib, which is not installed; "
                               "pip install matplotlib") from None
        matplotlib.use("Agg")  # files only: no display needed
        import matplotlib.pyplot as plt
        path = path or os.path.join(self.study_dir, "curves.png")
        styles = {"COMPLETE": "-", "PRUNED": "--", "FAIL": ":"}
        best = None if self.best_result is None else self.best_result["trial"]
        figure, axes = plt.subplots(figsize=(7, 4))
        drawn = 0
        for row in self.trials:
            points = self._curves[row["trial"]]
            if not points:
                continue
            steps, values = zip(*points)
            axes.plot(steps, values, styles.get(row["state"], "-."),
                      linewidth=2.5 if row["trial"] == best else 1.0,
                      label=f"trial {row['trial']} ({row['state'].lower()})")
            drawn += 1
        if not drawn:
            plt.close(figure)
            raise ValueError(f"TuneResults.plot: no trial of study {self.study_name!r} "
                             f"reported {self.metric!r} with neural_arch.tune.report")
        axes.set_xlabel("step")
        axes.set_ylabel(self.metric)
        axes.set_title(f"{self.study_name}: {self.metric} per trial")
        axes.grid(alpha=0.3)
        if drawn <= 12:
            axes.legend(fontsize="small")
        figure.tight_layout()
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        figure.savefig(path, dpi=100)
        plt.close(figure)
        return path


def _row(trial: Any, metric: str, constants: Mapping[str, Any],
         rerun: Mapping[int, int]) -> Dict[str, Any]:
    error = trial.user_attrs.get("error")
    if trial.number in rerun:
        error = (f"interrupted: the tuner stopped while it ran; its config runs again as "
                 f"trial {rerun[trial.number]}")
    duration = trial.duration
    return {"trial": trial.number, "state": trial.state.name,
            "config": config_of(trial.params, constants),
            metric: trial.value if trial.values else None,
            "steps": len(trial.intermediate_values),
            "last_step": trial.last_step, "last_report": trial.user_attrs.get("last_report"),
            "error": error, "retry_of": trial.user_attrs.get(RETRY_OF),
            "seconds": None if duration is None else duration.total_seconds(),
            "dir": trial.user_attrs.get("dir")}
