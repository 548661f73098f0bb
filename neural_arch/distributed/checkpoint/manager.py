"""Checkpoints of data-parallel training that survive crashes, and resuming from them.

Rank 0 of the group writes the shared state (weights, optimizer, scheduler, loss scaler, the
step counters and ``additional_state``); every rank's RNG states and sampler state travel to it
over the group and land in ``rank<r>.json``. Other ranks wait until the checkpoint is in place,
so no rank runs ahead of a half-written one. See ``format`` for the files.

Loading verifies every file against the manifest. Without a path, a bad checkpoint is skipped
with a warning naming the file, and the newest good one is used; a checkpoint named by ``path``
is loaded or refused (``CheckpointCorruptError`` naming the file), never swapped for another.
With a process group, rank 0 picks the checkpoint and the others follow, so all ranks resume
from the same step (``choice``). Groups that save into directories of their own but must go on
together (tensor-parallel ranks) agree over a ``resume_group``: all take the newest step intact
in every directory, or all raise ``CheckpointError``. Other processes may save into the same directory
meanwhile (``directory``).

Changing the world size between save and resume works for data parallel training (model and
optimizer are replicated): rank files of ranks that no longer exist are ignored, and a new rank
seeds its generators from rank 0's saved states and its own rank index (``derive_rng``), so a
relaunch of the same job is reproducible. It takes rank 0's sampler state.

A sharded model (``FullyShardedDataParallel``) is saved without gathering it: each rank writes
its own shard files and rank 0 the rest (``sharded``); it resumes on any world size. A ZeRO-1
optimizer (``consolidate_state_dict``) is consolidated on rank 0 before rank 0 writes it.

Resume convention: a checkpoint saved with ``(epoch, step)`` holds the state *after* that step;
``setup_fault_tolerant_training`` returns ``start_epoch=epoch`` and ``start_step=step + 1``,
the first step not yet done (counted the way the caller counted ``step``).
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DistributedError
from ..group.world import ProcessGroup, is_initialized, resolve_group
from . import choice, exchange
from . import format as fmt
from . import sharded as sharded_io
from . import state as state_io
from .directory import CheckpointDirectory
from .format import CheckpointCorruptError, CheckpointError, NoCheckpointError
from .values import check_json_data

__all__ = ["CheckpointCorruptError", "CheckpointError", "DistributedCheckpointManager",
           "NoCheckpointError", "setup_fault_tolerant_training"]


def _as_float(loss: Any) -> Optional[float]:
    if loss is None:
        return None
    value = getattr(loss, "array", loss)
    return float(value.item() if hasattr(value, "item") else value)


def _check_counter(name: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be a non-negative integer, got {value!r}")
    return int(value)


class DistributedCheckpointManager:
    """Saves, rotates, verifies and restores checkpoints in ``checkpoint_dir``.

    ``save_checkpoint`` and ``load_checkpoint`` are collective when a process group is
    initialized: every rank of ``group`` (default: the whole job) must call them together.
    ``rank``/``world_size`` default to the group's; without a process group they describe a
    single process (or let one rank read its own part of a checkpoint).

    ``resume_group`` (default: ``group``) holds every rank that must resume from the same step
    when their groups save into different directories, as tensor-parallel ranks each save
    their own shards over their data-parallel group: ``load_checkpoint`` without a path is then
    collective over it and takes the newest step intact in every one of those directories.
    """

    def __init__(self, checkpoint_dir: Any, max_checkpoints: int = 5,
                 rank: Optional[int] = None, world_size: Optional[int] = None,
                 group: Any = None, resume_group: Any = None) -> None:
        if isinstance(max_checkpoints, bool) or not isinstance(max_checkpoints, int) \
                or max_checkpoints < 1:
            raise ValueError(f"max_checkpoints must be a positive integer, got "
                             f"{max_checkpoints!r}")
        if resume_group is not None and not isinstance(resume_group, ProcessGroup):
            raise TypeError(f"resume_group must be a ProcessGroup or None, got "
                            f"{resume_group!r}")
        self._resume_group = resume_group
        self.checkpoint_dir = os.path.abspath(os.fspath(checkpoint_dir))
        self.max_checkpoints = max_checkpoints
        self._rank, self._world_size, self._group = rank, world_size, group
        self._directory = CheckpointDirectory(self.checkpoint_dir)
        self.best_loss = math.inf
        os.makedirs(self.checkpoint_dir, exist_ok=True)

    # ----- who am I ------------------------------------------------------------------------
    def _topology(self, op: str) -> Tuple[int, int, Any]:
        """(rank, world size, process group or None when there is nobody to talk to)."""
        if is_initialized():
            pg = resolve_group(self._group)
            pg.check_usable(op)
            for what, given, actual in (("rank", self._rank, pg.rank),
                                        ("world_size", self._world_size, pg.size)):
                if given is not None and given != actual:
                    raise ValueError(f"{op}: the manager was created with {what}={given}, the "
                                     f"process group says {actual}")
            return pg.rank, pg.size, (pg if pg.size > 1 else None)
        if self._group is not None:
            raise RuntimeError(f"{op}: a group was given but no process group is initialized")
        world_size = 1 if self._world_size is None else int(self._world_size)
        rank = 0 if self._rank is None else int(self._rank)
        if not 0 <= rank < world_size:
            raise ValueError(f"rank must be in [0, {world_size - 1}], got {rank}")
        return rank, world_size, None

    # ----- listing -------------------------------------------------------------------------
    def list_checkpoints(self) -> List[str]:
        """Paths of finished checkpoint directories, oldest first (not verified)."""
        return self._directory.list()

    def latest(self) -> Optional[str]:
        """The newest checkpoint whose files all match its manifest, or None (a damaged one
        passed over is named in a warning). Local: any rank may call it alone."""
        return self._directory.latest_good()

    # ----- save ----------------------------------------------------------------------------
    def save_checkpoint(self, model: Any, optimizer: Any, epoch: int, step: int, loss: Any,
                        additional_state: Optional[Dict[str, Any]] = None, scheduler: Any = None,
                        loss_scaler: Any = None, sampler: Any = None) -> str:
        """Write a checkpoint of the state after ``step``; returns its path on every rank."""
        rank, world_size, pg = self._topology("save_checkpoint")
        if world_size > 1 and pg is None:
            raise ValueError(f"saving as rank {rank} of {world_size} needs an initialized process "
                             f"group, so that rank 0 can collect every rank's state")
        name = fmt.checkpoint_name(_check_counter("epoch", epoch), _check_counter("step", step))
        local_error: Optional[Exception] = None
        try:
            check_json_data(additional_state, "additional_state")
            loss_value = _as_float(loss)
            mine = state_io.rank_state(rank, int(epoch), int(step), sampler)
        except Exception as exc:  # reported to every rank, so that none waits for this one
            if pg is None:
                raise
            local_error, mine = exc, {"error": f"{type(exc).__name__}: {exc}"}
        states = [mine] if pg is None else exchange.gather_json(pg, mine)
        if local_error is not None:
            raise local_error
        self._check_agreement(states, rank, pg)
        if pg is not None and callable(getattr(optimizer, "consolidate_state_dict", None)):
            optimizer.consolidate_state_dict(to=0)  # ZeRO-1: rank 0 writes every rank's state
        write_error: Optional[Exception] = None
        path = os.path.join(self.checkpoint_dir, name)
        shards = None
        if model is not None and sharded_io.is_sharded(state_io.unwrap_model(model)):
            if rank == 0:
                self._directory.remove_temporaries()
            shards = sharded_io.write_rank_shards(self.checkpoint_dir, name,
                                                  state_io.unwrap_model(model), optimizer, rank,
                                                  world_size, pg)
        if rank == 0:
            try:
                path = self._write(name, states, model, optimizer, epoch, step, loss_value,
                                   additional_state, scheduler, loss_scaler, world_size, shards)
            except Exception as exc:
                if pg is None:
                    raise
                write_error = exc
        if pg is not None:
            exchange.fail_together(pg, write_error, f"checkpoint {path} was not written",
                                   op="save_checkpoint", peer=pg.ranks[0])
        self._note_loss(loss_value)
        return path

    @staticmethod
    def _check_agreement(states: List[Dict[str, Any]], rank: int, pg: Any) -> None:
        failed = [(r, s["error"]) for r, s in enumerate(states) if "error" in s]
        if failed:
            peer, message = failed[0]
            raise DistributedError(f"checkpoint not saved: rank {peer} failed: {message}",
                                   rank=rank, peer=peer, op="save_checkpoint")
        counters = [(s["epoch"], s["step"]) for s in states]
        if len(set(counters)) > 1:
            raise ValueError(f"save_checkpoint called with different (epoch, step) per rank: "
                             f"{dict(enumerate(counters))}")

    def _write(self, name: str, states: List[Dict[str, Any]], model: Any, optimizer: Any,
               epoch: int, step: int, loss_value: Optional[float], additional_state: Any,
               scheduler: Any, loss_scaler: Any, world_size: int,
               shards: Optional[Tuple[str, Dict[str, Any]]] = None) -> str:
        best = min((v for v in (self.best_loss, loss_value) if v is not None and v == v),
                   default=math.inf)
        if shards is None:
            self._directory.remove_temporaries()
        files = state_io.build_files(states, model, optimizer, int(epoch), int(step), loss_value,
                                     best, world_size, additional_state, scheduler, loss_scaler)
        if shards is None:
            path = fmt.write_checkpoint_directory(self.checkpoint_dir, name, files)
        else:
            temporary, listing = shards
            try:
                listing.update({f: fmt.write_checkpoint_file(temporary, f, data)
                                for f, data in files.items()})
            except BaseException:
                fmt.remove_temporary_directory(temporary)
                raise
            path = fmt.finish_checkpoint_directory(self.checkpoint_dir, name, temporary, listing)
        self._directory.forget(path)
        self._directory.rotate(path, self.max_checkpoints)
        return path

    def _note_loss(self, loss: Optional[float]) -> None:
        if loss is not None and loss == loss:
            self.best_loss = min(self.best_loss, loss)

    # ----- load ----------------------------------------------------------------------------
    def load_checkpoint(self, model: Any = None, optimizer: Any = None, path: Any = None,
                        scheduler: Any = None, loss_scaler: Any = None, sampler: Any = None,
                        map_location: Any = None, *, restore_rng: bool = True) -> Dict[str, Any]:
        """Restore ``path``, or without it the newest good checkpoint (skipping damaged ones
        with a warning); with a ``resume_group``, the newest step good for all its ranks.

        Returns ``epoch``, ``step``, ``loss``, ``best_loss``, ``world_size`` (at save time),
        ``additional_state`` and ``path``. Arrays are read into host memory and copied into the
        existing parameters on their own device, so ``map_location`` (kept for PyTorch's
        signature) only accepts None or a device string. Raises ``NoCheckpointError`` when
        there is no checkpoint (with a ``resume_group``: no step good for all its ranks),
        ``CheckpointCorruptError`` naming the bad file when ``path`` is damaged, and
        ``CheckpointError`` when no checkpoint is good.
        """
        if map_location is not None and not isinstance(map_location, str):
            raise TypeError(f"map_location must be None or a device string, got "
                            f"{map_location!r}")
        rank, world_size, pg = self._topology("load_checkpoint")
        resume = self._resume_peers(pg) if path is None else None
        sync = resume if resume is not None else pg  # the ranks that succeed or fail together
        chosen, contents, failure = choice.read_chosen(self._directory, rank, world_size, pg,
                                                       resume, path, model, optimizer)
        if failure is None:
            try:
                result = state_io.apply_contents(contents, chosen, rank, model, optimizer,
                                                 scheduler, loss_scaler, sampler, restore_rng,
                                                 world_size)
                self.best_loss = result["best_loss"]
                self._note_loss(result["loss"])
            except Exception as exc:
                if sync is None:
                    raise
                failure = exc
        if sync is not None:
            exchange.fail_together(sync, failure, f"another rank failed to load its checkpoint "
                                   f"(this rank chose {chosen})", op="load_checkpoint")
        return result

    def _resume_peers(self, pg: Any) -> Any:
        """The wider group over which the step to resume from is agreed, or None when the
        checkpoint group itself decides (no ``resume_group``, or the same ranks)."""
        if self._resume_group is None:
            return None
        wide = resolve_group(self._resume_group)
        wide.check_usable("load_checkpoint")
        own = resolve_group(self._group).ranks if pg is None else pg.ranks
        outside = sorted(set(own) - set(wide.ranks))
        if outside:
            raise ValueError(f"load_checkpoint: resume_group (ranks {list(wide.ranks)}) must "
                             f"hold every rank of the checkpoint group (ranks {list(own)}); "
                             f"ranks {outside} are not in it")
        return None if sorted(wide.ranks) == sorted(own) else wide


def setup_fault_tolerant_training(model: Any, optimizer: Any,
                                  checkpoint_manager: DistributedCheckpointManager,
                                  scheduler: Any = None, loss_scaler: Any = None,
                                  sampler: Any = None) -> Dict[str, Any]:
    """Resume from the newest good checkpoint, if there is one.

    Returns ``start_epoch``, ``start_step`` (the first step not yet done: the saved step + 1),
    ``best_loss``, ``resumed``, ``checkpoint`` (path or None), ``loss`` and
    ``additional_state``; a fresh start gives zeros, ``best_loss=inf`` and ``resumed=False``.
    Collective like ``load_checkpoint``.
    """
    try:
        info = checkpoint_manager.load_checkpoint(model, optimizer, scheduler=scheduler,
                                                  loss_scaler=loss_scaler, sampler=sampler)
    except NoCheckpointError:
        return {"start_epoch": 0, "start_step": 0, "best_loss": math.inf, "resumed": False,
                "checkpoint": None, "loss": None, "additional_state": None}
    return {"start_epoch": info["epoch"], "start_step": info["step"] + 1,
            "best_loss": info["best_loss"], "resumed": True, "checkpoint": info["path"],
            "loss": info["loss"], "additional_state": info["additional_state"]}
