"""The lines rank 0 prints about how a run started: the backend ``--backend gloo`` became, and
the checkpoint a ``--resume`` continues from."""
from __future__ import annotations

import argparse
from typing import Any

from ..distributed import get_backend, get_rank
from ..training import Callback


def announce_backend(args: argparse.Namespace) -> None:
    """"gloo" is torch's name for its CPU backend; here it lets the job choose its CPU transport
    (shm on one host, tcp across hosts, mpi under mpirun), so say which one it got."""
    if args.backend == "gloo" and get_rank() == 0:
        print(f"--backend gloo: torch's CPU backend; here that is {get_backend()} (chosen "
              f"automatically)", flush=True)


class AnnounceResume(Callback):
    """Once the Trainer has loaded a checkpoint, rank 0 says which one: the step it continues
    after, and the epoch it continues in (numbered from 1, as the run's lines number them).
    The checkpoint is the one the loader chose (``Trainer.resumed_from``): the newest intact
    one, which is not the newest when that one is damaged."""

    def on_fit_start(self, trainer: Any) -> None:
        # None: nothing was loaded (claim_out_dir has already warned that there is none)
        if get_rank() != 0 or trainer.resumed_from is None:
            return
        print(f"resumed from {trainer.resumed_from} (step {trainer.step}, epoch "
              f"{trainer.epoch + 1})", flush=True)


__all__ = ["AnnounceResume", "announce_backend"]
