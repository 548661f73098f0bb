"""Which checkpoint a group loads, and each rank's part of it.

Rank 0 of the group chooses (``CheckpointDirectory.choose``: the one named by path, or the
newest good one), reading all of it, and tells the others, which read only their part.

Ranks that save into different directories but must go on together (tensor-parallel ranks,
each saving its own shards over its data-parallel group) agree over a wider ``resume`` group
instead: rank 0 of each group lists the checkpoints intact in its directory (naming each
damaged file in a warning), these lists are gathered over ``resume``, and every group takes
the newest step intact in all of them. When no step is, every rank raises
``CheckpointError`` saying what each directory holds, as one group does when none of its
checkpoints is good: a resume never trains some ranks from a checkpoint and others from
scratch, and never quietly starts over a run whose checkpoints exist.
"""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional, Tuple

from . import exchange
from . import format as fmt
from . import sharded as sharded_io
from . import state as state_io
from .directory import READ_ATTEMPTS, CheckpointDirectory
from .format import CheckpointChangedError, CheckpointError, NoCheckpointError

logger = logging.getLogger(__name__)


def read_chosen(directory: CheckpointDirectory, rank: int, world_size: int, pg: Any,
                resume: Any, path: Any, model: Any, optimizer: Any) -> Tuple[str, Any, Any]:
    """(path, contents, error while reading) of the checkpoint chosen for this rank's group.

    When another process removed or replaced it before every rank had read it, it is chosen
    again. With ``resume`` (agreement over a wider group), an error of this group is returned,
    not raised, so that ``load_checkpoint`` tells every rank of ``resume`` about it and none
    waits for the others; ``NoCheckpointError`` (nothing saved anywhere) and ``CheckpointError``
(no step intact everywhere) are raised on every rank of ``resume`` alike.
    """
    sync = resume if resume is not None else pg
    chosen = None
    for _ in range(READ_ATTEMPTS):
        contents, changed, failure, choice = None, False, None, None
        try:
            choice, contents = _choose(directory, rank, pg, resume, path)
            chosen = choice["path"]
            if contents is None:
                wanted = _wanted(rank, world_size, choice, model, optimizer)
                contents = fmt.read_checkpoint_directory(chosen, wanted)
        except CheckpointChangedError:
            changed = True
        except NoCheckpointError:
            raise
        except Exception as exc:
            if resume is None and choice is None:  # rank 0's choice failed: the group's too
                raise
            failure = exc
        if sync is None or exchange.all_succeeded(sync, not changed):
            return chosen, contents, failure
    raise CheckpointError(f"checkpoint {chosen} was removed or replaced before every rank had "
                          f"read it, {READ_ATTEMPTS} times in a row: checkpoints are saved into "
                          f"{directory.root} faster than a group can read one")


def _choose(directory: CheckpointDirectory, rank: int, pg: Any, resume: Any,
            path: Any) -> Tuple[Dict[str, Any], Any]:
    """Rank 0's choice (path, and whether and how it is sharded) with its contents there
    (None elsewhere); its error on every rank of the group."""
    chooser = rank == 0 or pg is None
    choice: Dict[str, Any] = {}
    contents, choice_error = None, None
    if resume is not None and not chooser:
        _agreed(directory, resume, chooser=False)  # only takes part in the gather
    if chooser:
        try:
            if resume is not None:
                chosen, contents = _agreed(directory, resume, chooser=True)
            else:
                if rank == 0:
                    directory.remove_temporaries()
                chosen, contents = directory.choose(path)
            meta = contents[fmt.META]
            # what the other ranks need to know to read only their part
            choice = {"path": chosen, "sharded": meta.get("sharded"),
                      "world_size": meta["world_size"]}
        except CheckpointChangedError as exc:  # the agreed one went meanwhile: choose again
            choice = {"changed": exc.directory}
        except Exception as exc:
            if pg is None:
                raise
            choice_error = exc
            choice = {"error": type(exc).__name__, "message": str(exc)}
    if pg is not None:
        choice = exchange.broadcast_json(pg, choice)
        if choice_error is not None:
            raise choice_error
        if "error" in choice:  # every rank fails the same way rank 0 did
            if choice["error"] == "NoCheckpointError":
                raise NoCheckpointError(choice["message"])
            raise CheckpointError(f"rank {pg.ranks[0]} could not choose a checkpoint: "
                                  f"{choice['error']}: {choice['message']}")
    if "changed" in choice:
        raise CheckpointChangedError(choice["changed"])
    return choice, contents


def _agreed(directory: CheckpointDirectory, resume: Any,
            chooser: bool) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Every rank of ``resume`` calls it; each group's chooser gets the path and contents of
    the newest checkpoint intact in every chooser's directory, the others None."""
    offer = None
    if chooser:
        try:
            directory.remove_temporaries()
            listed = len(directory.list())
            intact = [os.path.basename(p) for p in directory.intact_newest_first()]
            offer = {"directory": directory.root, "listed": listed, "intact": intact}
        except Exception as exc:  # told to every rank, so that none waits for this one
            offer = {"error": f"{type(exc).__name__}: {exc}"}
    offers = exchange.gather_json(resume, offer)
    if not chooser:
        return None
    failed = [(resume.ranks[r], o["error"]) for r, o in enumerate(offers)
              if o is not None and "error" in o]
    if failed:
        raise CheckpointError(f"rank {failed[0][0]} could not list its checkpoints: "
                              f"{failed[0][1]}")
    offered = {resume.ranks[r]: o for r, o in enumerate(offers) if o is not None}
    common = set.intersection(*(set(o["intact"]) for o in offered.values()))
    if not common:
        if not any(o["listed"] for o in offered.values()):
            raise NoCheckpointError("no checkpoint in " + ", ".join(
                o["directory"] for o in offered.values()))
        held = "; ".join(f"rank {r}: {o['directory']} holds "
                         f"{', '.join(o['intact']) or 'no intact checkpoint'}"
                         for r, o in offered.items())
        raise CheckpointError(f"no checkpoint step is intact on every rank ({held}): resume "
                              f"needs one step that all of them can load")
    name = max(common, key=fmt.parse_checkpoint_name)
    if offer["intact"][0] != name:
        logger.warning("checkpoint %s is intact here but not on every rank: resuming from %s, "
                       "the newest step intact on all %d ranks",
                       os.path.join(directory.root, offer["intact"][0]),
                       os.path.join(directory.root, name), resume.size)
    path = os.path.join(directory.root, name)
    return path, fmt.read_checkpoint_directory(path)


def _wanted(rank: int, world_size: int, choice: Dict[str, Any], model: Any,
            optimizer: Any) -> set:
    wanted = {fmt.rank_file(rank), fmt.rank_file(0)}
    inner = None if model is None else state_io.unwrap_model(model)
    if choice.get("sharded") and inner is not None and sharded_io.is_sharded(inner):
        wanted |= sharded_io.files_needed(
            choice["sharded"]["layout"], choice["world_size"], rank, world_size,
            sharded_io.layout_of(inner), optimizer is not None)
    return wanted
