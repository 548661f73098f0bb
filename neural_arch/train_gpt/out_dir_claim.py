"""A training job's claim on ``--out-dir``, made before any rank reads the data or writes.

Rank 0 alone takes the directory's lock (``out_dir_lock``: one job per directory, whatever its
world size) and, for ``--resume``, checks what the resume will read: ``run.json``,
``tokenizer.json`` and that a checkpoint is whole. The other ranks wait for its verdict, so
when the job is refused every rank exits with code 2 together, none left waiting in a
collective for a rank that is gone. ``--resume`` with no checkpoint at all is not refused: it
trains from step 0 after one warning line, as the Trainer's ``resume=True`` starts fresh.
"""
from __future__ import annotations

import argparse
import os
import sys
from contextlib import contextmanager
from typing import Iterator, Optional

from ..distributed import broadcast_object_list, get_rank, get_world_size
from .args import PROG, UsageError
from .out_dir_lock import OutDirLock
from .saved_run import (RUN_FILE, TOKENIZER_FILE, checkpoint_directory, newest_good_checkpoint,
                        read_run_file)
from .text import Tokenizer


@contextmanager
def claim_out_dir(args: argparse.Namespace, out_dir: str) -> Iterator[None]:
    """Collective: holds ``out_dir`` on rank 0 for the body; raises UsageError on every rank
    when the job may not train there."""
    lock: Optional[OutDirLock] = None
    verdict, failure = {"refused": None, "failed": None}, None
    if get_rank() == 0:
        try:
            lock = OutDirLock(out_dir).acquire()
            if args.resume:
                check_resume(args, out_dir)
        except UsageError as exc:
            verdict["refused"] = str(exc)
        except Exception as exc:  # noqa: BLE001 - the other ranks must hear of it too
            failure = exc
            verdict["failed"] = f"{type(exc).__name__}: {exc}"
    try:
        if get_world_size() > 1:
            shared = [verdict]
            broadcast_object_list(shared, src=0)
            verdict = shared[0]
        if failure is not None:
            raise failure
        if verdict["refused"]:
            raise UsageError(verdict["refused"])
        if verdict["failed"]:
            raise RuntimeError(f"rank 0 failed while claiming --out-dir {out_dir}: "
                               f"{verdict['failed']}")
        yield
    finally:
        if lock is not None:
            lock.release()


def check_resume(args: argparse.Namespace, out_dir: str) -> None:
    """What ``--resume`` reads, checked on rank 0; UsageError naming the damaged file."""
    run_path, tokenizer_path = os.path.join(out_dir, RUN_FILE), os.path.join(out_dir,
                                                                             TOKENIZER_FILE)
    try:
        if os.path.lexists(run_path):
            read_run_file(run_path)
        if os.path.lexists(tokenizer_path):
            Tokenizer.load(tokenizer_path)
    except ValueError as exc:
        raise UsageError(f"--resume: {exc}; restore it, or train into a fresh --out-dir") \
            from None
    directory = checkpoint_directory(out_dir, args.tp, args.pp)
    try:
        newest = newest_good_checkpoint(directory)
    except ValueError as exc:
        raise UsageError(f"--resume: {exc}; remove the damaged checkpoint to start from step "
                         f"0, or train into a fresh --out-dir") from None
    if newest is None:
        print(f"{PROG}: warning: --resume: no checkpoint in {directory}; starting from step 0",
              file=sys.stderr, flush=True)


__all__ = ["check_resume", "claim_out_dir"]
