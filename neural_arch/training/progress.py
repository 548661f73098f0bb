"""What rank 0 shows while training: a tqdm bar over the optimizer steps when the output is a
terminal, directly or through the launcher (and tqdm is installed), interval lines and a final
summary in any case. Other ranks get a Progress with everything disabled, so the loop calls it
without asking who it is.

Epochs are numbered from 1 in the values it is given, as in the records and the History. The
summary counts the epochs the lines named, so a run stopped inside its first epoch reports
that epoch, unfinished, not "0 epochs". It is printed after the bar is closed: the bar draws
its last state once, above it, and nothing follows the summary."""
from __future__ import annotations

import os
import sys
from typing import Any, Dict, Optional

from ..distributed.launch.config import CONSOLE_TTY_VAR


def console_is_terminal() -> bool:
    """Whether a bar drawn on stderr is seen on a terminal: stderr is one, or the launcher
    that started this worker (and pipes its stderr through) writes to one."""
    try:
        if sys.stderr.isatty():
            return True
    except (AttributeError, ValueError):
        return False
    return os.environ.get(CONSOLE_TTY_VAR) == "1"


def _format(kind: str, step: int, total: int, values: Dict[str, Any]) -> str:
    parts = [f"{kind:5s} step {step}/{total}", f"epoch {values.get('epoch')}"]
    for key, fmt in (("loss", "loss {:.4f}"), ("train_loss", "train_loss {:.4f}"),
                     ("val_loss", "val_loss {:.4f}"), ("val_accuracy", "val_acc {:.4f}"),
                     ("lr", "lr {:.2e}"), ("grad_norm", "grad_norm {:.3f}"),
                     ("tokens_per_second", "{:,.0f} tok/s"),
                     ("samples_per_second", "{:,.1f} samples/s"),
                     ("comm_seconds", "comm {:.3f}s")):
        value = values.get(key)
        if value is not None:
            parts.append(fmt.format(value))
    return " | ".join(parts)


class Progress:
    def __init__(self, total: int, done: int, enabled: bool, verbose: bool) -> None:
        self.total, self.verbose, self._bar = total, verbose, None
        self._last_epoch = 0  # the number of the latest epoch a line was about
        if enabled and console_is_terminal():
            try:
                from tqdm import tqdm
            except ImportError:  # plain lines only
                tqdm = None
            if tqdm is not None:
                self._bar = tqdm(total=total, initial=done, unit="step", dynamic_ncols=True)

    def _print(self, text: str) -> None:
        if self._bar is not None:
            self._bar.write(text)  # above the bar, which stays at the bottom
        else:
            print(text, flush=True)

    def line(self, kind: str, step: int, values: Dict[str, Any]) -> None:
        self._last_epoch = max(self._last_epoch, int(values.get("epoch") or 0))
        if self.verbose:
            self._print(_format(kind, step, self.total, values))

    def advance(self, loss: Optional[float]) -> None:
        if self._bar is not None:
            self._bar.update()
            if loss is not None:
                self._bar.set_postfix(loss=f"{loss:.4f}")

    def summary(self, history: Any, world: int, tokens_per_sample: Optional[int]) -> None:
        self.close()  # the bar's last state, once; the summary is the last line
        if not self.verbose:
            return
        last = history.epochs[-1] if history.epochs else {}
        seconds, samples = history.total_time, history.samples
        finished = len(history.epochs)
        epochs = max(finished, self._last_epoch)
        text = f"done: {history.steps} steps, {epochs} epoch{'' if epochs == 1 else 's'}"
        if epochs > finished:
            text += f" (epoch {epochs} unfinished)"
        text += f", {seconds:.1f}s on {world} data-parallel rank(s)"
        if history.last_loss is not None:
            text += f", last train loss {history.last_loss:.4f}"
        if last.get("val_loss") is not None:
            text += f", val_loss {last['val_loss']:.4f}"
        if history.best is not None:
            text += f", best {history.monitor} {history.best:.4f} (epoch {history.best_epoch})"
        if samples and seconds:
            text += f", {samples / seconds:,.1f} samples/s"
            if tokens_per_sample:
                text += f", {samples * tokens_per_sample / seconds:,.0f} tokens/s"
        if history.stopped_early:
            text += ", stopped early"
        self._print(text)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
