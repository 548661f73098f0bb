"""Checkpoints of a ``--pp`` run: ``GPT3D``'s collective checkpoint plus the loop's state.

``GPT3D.save`` writes every rank's piece, its optimizer state and the step count into one
directory named as the Trainer names its checkpoints (``ckpt-e<epoch>-s<step>``), so the
newest is found the same way. What the loop needs beyond that to continue its records (the
position in the epoch, the epoch's loss sums, the elapsed time and the history) goes beside
it, in ``<name>.loop.json``, written by rank 0 after the checkpoint is complete: without it a
resume still continues the weights, optimizer and step count, and derives the position from
the step. The newest three checkpoints are kept, as the Trainer keeps them.
"""
from __future__ import annotations

import json
import os
from typing import Any, Dict, Optional

from ..distributed import get_rank
from ..distributed.checkpoint import exchange
from ..distributed.checkpoint import format as fmt
from ..distributed.checkpoint.directory import CheckpointDirectory
from ..distributed.group.world import resolve_group
from .args import UsageError

KEEP = 3
LOOP_SUFFIX = ".loop.json"


def latest_checkpoint(directory: str) -> Optional[str]:
    """The newest complete checkpoint in ``directory`` (every file checked), or None; a
    damaged one passed over is named, with its bad file, in a warning."""
    return CheckpointDirectory(directory).latest_good()


class PipelineCheckpoints:
    """Save and resume ``model`` (a ``GPT3D``) in ``directory``; both are collective."""

    def __init__(self, directory: str, model: Any) -> None:
        self.directory, self.model = directory, model

    def save(self, epoch: int, loop_state: Dict[str, Any]) -> str:
        path = self.model.save(self.directory, fmt.checkpoint_name(epoch, self.model.steps))
        if get_rank() == 0:
            _write_json(path + LOOP_SUFFIX, loop_state)
            for old in CheckpointDirectory(self.directory).list()[:-KEEP]:
                fmt.remove_checkpoint_directory(old)
                if os.path.exists(old + LOOP_SUFFIX):
                    os.remove(old + LOOP_SUFFIX)
        return path

    def resume(self) -> Optional[Dict[str, Any]]:
        """Load the newest checkpoint (rank 0 checks every rank's pieces and chooses it for
        everyone, warning of each damaged one it passes over); its loop state, ``{}`` when that
        file is missing, or None when there is no checkpoint to resume from."""
        world = resolve_group(None)
        chosen = {"path": latest_checkpoint(self.directory)} if world.rank == 0 else {}
        path = exchange.broadcast_json(world, chosen)["path"]
        if path is None:
            return None
        try:
            self.model.load(path)
        except ValueError as exc:  # another mesh: the flags describe another run
            raise UsageError(f"--resume: {exc}") from None
        try:
            with open(path + LOOP_SUFFIX, encoding="utf-8") as handle:
                return json.load(handle)
        except FileNotFoundError:
            return {}


def _write_json(path: str, value: Any) -> None:
    """Whole or not at all: a crash never leaves half a file under ``path``."""
    temporary = f"{path}.tmp-{os.getpid()}"
    with open(temporary, "w", encoding="utf-8") as handle:
        json.dump(value, handle)
    os.replace(temporary, path)
