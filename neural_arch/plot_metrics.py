"""``python -m neural_arch.plot_metrics RUN_DIR [--out PNG]``: the loss curves of a run.

Reads ``RUN_DIR/metrics.jsonl`` (written by ``neural_arch.training.Trainer``) and draws the
training loss of each logging interval and the validation loss (interval and per-epoch
validations) against the optimizer step; writes ``RUN_DIR/loss.png`` unless ``--out`` says
otherwise. matplotlib is imported only here, so training never needs it."""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Dict, List, Optional, Tuple

from .training.metrics import METRICS_FILE

Curve = Tuple[List[int], List[float]]


def read_curves(run_dir: str) -> Dict[str, Curve]:
    """{"train": (steps, losses), "val": (steps, losses)} from the run's metrics."""
    path = os.path.join(run_dir, METRICS_FILE)
    curves: Dict[str, Curve] = {"train": ([], []), "val": ([], [])}
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
            kind, value = record.get("kind"), None
            if kind == "train":
                value, name = record.get("loss"), "train"
            elif kind in ("val", "epoch"):
                value, name = record.get("val_loss"), "val"
            if value is not None:
                curves[name][0].append(int(record["step"]))
                curves[name][1].append(float(value))
    return curves


def draw_curves(curves: Dict[str, Tuple[List[int], List[float]]], title: str, out: str,
                ylabel: str = "loss", dpi: int = 110) -> str:
    """The "train" and "val" loss curves (steps, losses) against the optimizer step, into the
    image file ``out`` (matplotlib, no display needed)."""
    import matplotlib
    matplotlib.use("Agg")  # files only: no display needed
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, style in (("train", "-"), ("val", "o-")):
        steps, losses = curves[name]
        if steps:
            axes.plot(steps, losses, style, label=f"{name} loss", markersize=3)
    axes.set_xlabel("optimizer step")
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out, dpi=dpi)
    plt.close(figure)
    return out


def plot(run_dir: str, out: Optional[str] = None) -> str:
    curves = read_curves(run_dir)
    if not curves["train"][0] and not curves["val"][0]:
        raise ValueError(f"{os.path.join(run_dir, METRICS_FILE)} has no loss values to plot")
    return draw_curves(curves, os.path.basename(os.path.abspath(run_dir)),
                       out or os.path.join(run_dir, "loss.png"), ylabel="cross-entropy loss")


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m neural_arch.plot_metrics",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", help="a directory holding metrics.jsonl")
    parser.add_argument("--out", default=None, help="PNG path (default RUN_DIR/loss.png)")
    args = parser.parse_args(argv)
    try:
        print(plot(args.run_dir, args.out))
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
