"""Inside a worker's training loop: ``report``, ``get_context`` and ``get_checkpoint``.

The worker actor opens a session before it calls the loop and closes it afterwards; outside one
these functions raise, naming what is missing. Unlike Ray Train's, ``report`` is no barrier: it
copies the checkpoint (if any) into the run's folder, records the report and returns. A report
counts once every worker has made it (``storage``), which is what the driver reads.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from typing import Any, Dict, Optional

from . import storage
from .checkpoint import Checkpoint


@dataclass(frozen=True)
class TrainContext:
    """Where this worker stands in the run."""
    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str
    storage_path: str

    def get_world_rank(self) -> int:
        return self.world_rank

    def get_world_size(self) -> int:
        return self.world_size

    def get_local_rank(self) -> int:
        return self.local_rank

    def get_local_world_size(self) -> int:
        return self.local_world_size

    def get_node_rank(self) -> int:
        return self.node_rank

    def get_experiment_name(self) -> str:
        return self.experiment_name

    def get_storage_path(self) -> str:
        return self.storage_path


class _Session:
    def __init__(self, context: TrainContext, run_dir: str, next_index: int,
                 checkpoint: Optional[str], num_to_keep: Optional[int]) -> None:
        self.context, self.run_dir, self.index = context, run_dir, next_index
        self.checkpoint = Checkpoint(checkpoint) if checkpoint else None
        self.num_to_keep = num_to_keep

    def report(self, metrics: Dict[str, Any], checkpoint: Optional[Checkpoint]) -> None:
        rank = self.context.world_rank
        if checkpoint is not None:
            target = storage.checkpoint_dir(self.run_dir, self.index)
            # A worker's own copy is what a restart reads: copying it in place first makes the
            # record below the moment this rank's part of the checkpoint is complete.
            if os.path.abspath(checkpoint.path) != target:
                shutil.copytree(checkpoint.path, target, dirs_exist_ok=True)
        storage.write_record(self.run_dir, self.index, rank, dict(metrics), checkpoint is not None)
        self.index += 1
        if rank == 0 and self.num_to_keep is not None and checkpoint is not None:
            reports = storage.complete_reports(self.run_dir, self.context.world_size)
            storage.prune_checkpoints(self.run_dir, reports, self.num_to_keep)


_SESSION: Optional[_Session] = None


def _session(what: str) -> _Session:
    if _SESSION is None:
        raise RuntimeError(f"neural_arch.ray.{what}() works only inside a training loop that "
                           f"RayTrainer.fit() runs on its workers")
    return _SESSION


def open_session(context: TrainContext, run_dir: str, next_index: int,
                 checkpoint: Optional[str], num_to_keep: Optional[int]) -> None:
    global _SESSION
    _SESSION = _Session(context, run_dir, next_index, checkpoint, num_to_keep)


def close_session() -> None:
    global _SESSION
    _SESSION = None


def next_report_index() -> int:
    """The index the open session's next report would take (reports made so far included)."""
    return _session("next_report_index").index


def report(metrics: Dict[str, Any], checkpoint: Optional[Checkpoint] = None) -> None:
    """Report ``metrics`` (a dict with string keys) and, optionally, a checkpoint directory,
    which is copied into the run's folder before this returns. Every worker must make the same
    reports in the same order; worker 0's metrics are the ones the run keeps."""
    session = _session("report")
    if not isinstance(metrics, dict) or not all(isinstance(k, str) for k in metrics):
        raise TypeError(f"report(metrics=...) takes a dict with string keys, got "
                        f"{type(metrics).__name__}: {metrics!r:.200}")
    if checkpoint is not None and not isinstance(checkpoint, Checkpoint):
        raise TypeError(f"report(checkpoint=...) takes a neural_arch.ray.Checkpoint, got "
                        f"{type(checkpoint).__name__}")
    session.report(metrics, checkpoint)


def get_context() -> TrainContext:
    """This worker's ranks and the run's name."""
    return _session("get_context").context


def get_checkpoint() -> Optional[Checkpoint]:
    """The checkpoint to resume from: the newest one registered before this attempt (after a
    restart, or ``RayTrainer(resume_from_checkpoint=...)``); None on a fresh start."""
    return _session("get_checkpoint").checkpoint
