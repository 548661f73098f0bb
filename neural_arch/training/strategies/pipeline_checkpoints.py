"""Checkpoints of the "pipeline" strategy: ``GPT3D``'s collective checkpoint plus the loop's
state.

``GPT3D.save`` writes every rank's piece, its optimizer state and the step count into one
directory named as the checkpoint manager names its checkpoints (``ckpt-e<epoch>-s<step>``),
so the newest is found the same way. The loop's state (the position in the epoch, the epoch's
loss sums, the elapsed time, the history, the callbacks') goes beside it, in
``<name>.loop.json``, written by rank 0 once the checkpoint is complete: without it a resume
still continues the weights, optimizer and step count, and the loop derives its position from
the step. The schedules are closed forms of the step count, so a resume replays the scheduler
up to the step instead of saving it. The newest ``keep`` checkpoints are kept.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from ...distributed import get_rank
from ...distributed.checkpoint import exchange
from ...distributed.checkpoint import format as fmt
from ...distributed.checkpoint.directory import CheckpointDirectory
from ...distributed.group.world import resolve_group

LOOP_SUFFIX = ".loop.json"


class PipelineCheckpoints:
    """Save and resume ``model`` (a ``GPT3D``) in ``directory``; both are collective over the
    whole job."""

    def __init__(self, directory: str, model: Any, keep: int) -> None:
        self.directory, self.model, self.keep = directory, model, int(keep)
        self.loaded_path: Optional[str] = None  # the checkpoint ``load`` restored

    def save(self, epoch: int, step: int, loss: Optional[float], loop_state: Dict[str, Any],
             scheduler: Any = None, sampler: Any = None) -> str:
        path = self.model.save(self.directory, fmt.checkpoint_name(epoch, step))
        if get_rank() == 0:
            _write_json(path + LOOP_SUFFIX, loop_state)
            for old in CheckpointDirectory(self.directory).list()[:-self.keep]:
                fmt.remove_checkpoint_directory(old)
                if os.path.exists(old + LOOP_SUFFIX):
                    os.remove(old + LOOP_SUFFIX)
        return path

    def load(self, scheduler: Any = None, sampler: Any = None) -> Optional[Dict[str, Any]]:
        """Load the newest complete checkpoint (rank 0 checks every rank's pieces, warning of
        each damaged one it passes over, and chooses for everyone); the loop state saved with
        it (``{"step": ...}`` alone when that file is missing), or None when there is none.
        ValueError when it was saved on another mesh."""
        world = resolve_group(None)
        chosen = ({"path": CheckpointDirectory(self.directory).latest_good()}
                  if world.rank == 0 else {})
        path = exchange.broadcast_json(world, chosen)["path"]
        if path is None:
            return None
        self.model.load(path)
        self.loaded_path = path
        for _ in range(self.model.steps if scheduler is not None else 0):
            scheduler.step()
        try:
            with open(path + LOOP_SUFFIX, encoding="utf-8") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            state = {}
        return dict(state, step=self.model.steps)


def _write_json(path: str, value: Any) -> None:
    """Whole or not at all: a crash never leaves half a file under ``path``."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
    os.replace(temporary, path)
