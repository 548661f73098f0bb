"""The lines rank 0 prints about how a run started: the backend ``--backend gloo`` became, and
the checkpoint a ``--resume`` continues from."""
from __future__ import annotations

import argparse
import os
from typing import Any, Optional

from ..distributed import get_backend, get_rank
from ..distributed.checkpoint.directory import CheckpointDirectory
from ..distributed.checkpoint.format import parse_checkpoint_name
from ..training import Callback


def announce_backend(args: argparse.Namespace) -> None:
    """"gloo" is torch's name for its CPU backend; here it lets the job choose its CPU transport
    (shm on one host, tcp across hosts, mpi under mpirun), so say which one it got."""
    if args.backend == "gloo" and get_rank() == 0:
        print(f"--backend gloo: torch's CPU backend; here that is {get_backend()} (chosen "
              f"automatically)", flush=True)


def checkpoint_of_step(directory: str, step: int) -> Optional[str]:
    """The checkpoint directory in ``directory`` saved at ``step`` (names carry the step)."""
    for path in reversed(CheckpointDirectory(directory).list()):
        parsed = parse_checkpoint_name(os.path.basename(path))
        if parsed is not None and parsed[1] == step:
            return path
    return None


class AnnounceResume(Callback):
    """Once the Trainer has loaded a checkpoint, rank 0 says which one: the step it continues
    after, and the epoch it continues in (numbered from 1, as the run's lines number them).
    ``directory``: rank 0's checkpoint directory."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def on_fit_start(self, trainer: Any) -> None:
        # step 0: nothing was loaded (claim_out_dir has already warned that there is none)
        if get_rank() != 0 or trainer.step == 0:
            return
        path = checkpoint_of_step(self.directory, trainer.step) or \
            f"the checkpoint of step {trainer.step} in {self.directory}"
        print(f"resumed from {path} (step {trainer.step}, epoch {trainer.epoch + 1})",
              flush=True)


__all__ = ["AnnounceResume", "announce_backend", "checkpoint_of_step"]
