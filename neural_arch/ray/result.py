"""What ``RayTrainer.fit`` returns, ``Result``, and what it raises, ``TrainingFailedError``."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from .checkpoint import Checkpoint


@dataclass
class Result:
    """``metrics``: the last metrics worker 0 reported; ``checkpoint``: the newest registered
    checkpoint (None if none was reported); ``error``: why the run failed (None when it
    finished); ``path``: the run's folder on storage; ``attempts``: how many times the worker
    group was started (1 + the restarts)."""
    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional[Checkpoint]
    error: Optional[BaseException]
    path: str
    attempts: int = 1
    metrics_history: list = field(default_factory=list)  # worker 0's reports, in order


class TrainingFailedError(RuntimeError):
    """The run failed more often than ``FailureConfig.max_failures`` allows.

    ``worker_failures`` maps the world rank of each worker that failed in the last attempt to
    its error (the loop's own exception, or Ray's error for a worker whose process died);
    ``result`` is the run's ``Result`` with ``error`` set to this exception."""

    def __init__(self, message: str, worker_failures: Dict[int, BaseException],
                 result: Optional[Result] = None) -> None:
        super().__init__(message)
        self.worker_failures = dict(worker_failures)
        self.result = result
