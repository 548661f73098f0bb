"""What each process of a trial runs: ``train_fn(config)`` with the trial's context set.

The launcher starts ``run_worker(recipe, trial_dir)`` (``training.launching.worker``) in each
of the trial's processes: rank 0's return value and any rank's exception land in the trial's
directory for the tuner to read. Trials run side by side, so each process writes its output
to ``rank_<R>.log`` in the trial's directory instead of the tuner's console, where the lines
of concurrent trials would mix; its traceback, if it raises, goes there too.
"""
from __future__ import annotations

import os
import sys
from typing import Any, Callable, Dict

from . import session


def log_path(directory: str, rank: int) -> str:
    return os.path.join(directory, f"rank_{rank}.log")


def _output_to(path: str) -> None:
    """This process's stdout and stderr (Python's and any C library's) into ``path``."""
    sys.stdout.flush()
    sys.stderr.flush()
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(descriptor, 1)
        os.dup2(descriptor, 2)
    finally:
        os.close(descriptor)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)  # the log follows the run line by line
        except AttributeError:  # a replaced stream
            pass


def _plain(result: Any) -> Any:
    """What travels back to the tuner: a number or a dict of numbers (or None)."""
    if result is None or isinstance(result, (int, float, dict)):
        return result
    try:  # a NumPy scalar
        return float(result)
    except (TypeError, ValueError):
        raise TypeError(f"train_fn must return None, a number or a dict of metrics, got "
                        f"{type(result).__name__}") from None


class TrialRecipe:
    def __init__(self, train_fn: Callable[[Dict[str, Any]], Any], config: Dict[str, Any],
                 number: int, directory: str) -> None:
        self.train_fn, self.config = train_fn, dict(config)
        self.number, self.directory = number, directory

    def __call__(self) -> Any:
        rank = int(os.environ.get("RANK", "0"))
        world = int(os.environ.get("WORLD_SIZE", "1"))
        _output_to(log_path(self.directory, rank))
        session.start(session.TrialContext(self.number, self.directory, rank, world))
        return _plain(self.train_fn(dict(self.config)))

    def __repr__(self) -> str:
        name = getattr(self.train_fn, "__qualname__", type(self.train_fn).__name__)
        return f"TrialRecipe({name}, trial {self.number})"
