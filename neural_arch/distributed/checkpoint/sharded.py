"""Sharded checkpoints: every rank writes its own pieces, any world size reads them back.

A sharded model (``FullyShardedDataParallel``) keeps each of its flat parameters as a 1/N
shard per rank: rank ``r`` holds elements ``[r*s, (r+1)*s)`` of the flat, padded to ``N*s``
elements. Saving gathers nothing: rank ``r`` writes ``model.shard<r>.safetensors`` (its part of
every flat, padding cut off) and ``optimizer.shard<r>.safetensors`` (the optimizer state of its
shards, cut the same way) into the checkpoint directory rank 0 began; rank 0 writes the rest and
the manifest, which lists every rank's files with their checksums. ``meta.json`` records the
layout (each flat's name and true length) and the world size of the save.

Loading at world size ``N'`` gives rank ``r'`` the elements ``[r'*s', (r'+1)*s')`` of each flat,
cut from the saved pieces that overlap them: only those files are read, each verified against
the manifest, so a damaged shard is named. The padding is zero again after a load.

The model side is duck-typed: ``model.flat_shards()`` lists the flats in a fixed order, each
with ``unit`` (its name), ``shard`` (this rank's ``Parameter``), ``numel`` (true length) and
``padded_numel``; ``model.shards_changed()``, if there, is called after a load. A shard of ``padded_numel / N`` elements is rank ``r``'s ``r``-th slice; a
shard of the whole padded flat is a replica (``NO_SHARD``), which rank 0 alone writes.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ..errors import DistributedError
from . import exchange
from . import format as fmt
from .format import CheckpointCorruptError
from .values import host_array, is_array

Layout = List[Dict[str, Any]]  # per flat, in order: name, numel, padded, size (of a shard)


def is_sharded(model: Any) -> bool:
    """Whether ``model`` keeps its parameters as per-rank shards."""
    return callable(getattr(model, "flat_shards", None))


def _entry(flat: Any) -> Dict[str, Any]:
    return {"name": flat.unit, "numel": int(flat.numel), "padded": int(flat.padded_numel),
            "size": int(flat.shard.array.size)}


def layout_of(model: Any) -> Layout:
    return [_entry(f) for f in model.flat_shards()]


def _held(entry: Dict[str, Any], rank: int, world_size: int) -> Tuple[int, int]:
    """The [start, stop) of the true elements that ``rank``'s shard holds."""
    size = entry["size"]
    start = rank * size if size * world_size == entry["padded"] else 0  # else a replica
    start = min(start, entry["numel"])
    return start, min(start + size, entry["numel"])


def _saved(entry: Dict[str, Any], rank: int, world_size: int) -> Tuple[int, int]:
    """The [start, stop) that ``rank`` writes: what it holds, but a replica only once."""
    replica = entry["size"] * world_size != entry["padded"]
    return (0, 0) if replica and rank > 0 else _held(entry, rank, world_size)


def _optimizer_index(optimizer: Any, model: Any) -> List[int]:
    """The optimizer's parameter index (PyTorch's ``state_dict`` numbering) of every flat."""
    order = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
    indices = []
    for flat in model.flat_shards():
        if id(flat.shard) not in order:
            raise ValueError(f"the optimizer does not hold the shard of flat parameter "
                             f"{flat.unit!r}: build it over the sharded model's parameters()")
        indices.append(order[id(flat.shard)])
    return indices


def shard_file_bytes(model: Any, optimizer: Any, rank: int, world_size: int
                     ) -> Dict[str, bytes]:
    """This rank's shard files: its true elements of every flat and of their optimizer state."""
    model_file, optimizer_file = fmt.shard_files(rank)
    pieces: Dict[str, np.ndarray] = {}
    cuts = []
    for flat in model.flat_shards():
        entry = _entry(flat)
        start, stop = _saved(entry, rank, world_size)
        held = _held(entry, rank, world_size)
        cut = slice(start - held[0], stop - held[0])
        cuts.append(cut)
        pieces[entry["name"]] = host_array(flat.shard.array)[cut]
    files = {model_file: fmt.safetensors_bytes(pieces)}
    if optimizer is not None:
        state = optimizer.state_dict()["state"]
        arrays: Dict[str, np.ndarray] = {}
        for flat, cut, index in zip(model.flat_shards(), cuts, _optimizer_index(optimizer, model)):
            for key, value in state.get(index, {}).items():
                if is_array(value) and np.ndim(value) > 0:
                    if tuple(value.shape) != tuple(flat.shard.array.shape):
                        raise ValueError(
                            f"optimizer state {key!r} of flat parameter {flat.unit!r} has shape "
                            f"{tuple(value.shape)}, its shard {tuple(flat.shard.array.shape)}: "
                            "only state shaped like the shard can be resharded")
                    arrays[f"state.{index}.{key}"] = host_array(value)[cut]
        files[optimizer_file] = fmt.safetensors_bytes(arrays)
    return files


def files_needed(layout: Layout, saved_world: int, rank: int, world_size: int,
                 now: Layout, optimizer: bool) -> set:
    """The shard files whose saved pieces overlap what ``rank`` holds at ``world_size``
    (``now``: the layout of the model being loaded)."""
    ranks = set()
    for saved, current in zip(layout, now):
        want = _held(current, rank, world_size)
        for q in range(saved_world):
            have = _saved(saved, q, saved_world)
            if have[0] < want[1] and want[0] < have[1]:
                ranks.add(q)
    return {name for q in ranks for name in fmt.shard_files(q)[:2 if optimizer else 1]}


def _assemble(read_piece, saved: Dict[str, Any], saved_world: int, want: Tuple[int, int],
              size: int, dtype: Any) -> np.ndarray:
    """This rank's shard (``size`` elements, zero padding) from the saved pieces."""
    out = np.zeros(size, dtype=dtype)
    for q in range(saved_world):
        have = _saved(saved, q, saved_world)
        lo, hi = max(have[0], want[0]), min(have[1], want[1])
        if lo < hi:
            piece = read_piece(q)
            if piece.shape != (have[1] - have[0],):
                raise ValueError(f"saved piece of rank {q} of {saved['name']!r} has shape "
                                 f"{piece.shape}, expected ({have[1] - have[0]},)")
            out[lo - want[0]:hi - want[0]] = piece[lo - have[0]:hi - have[0]]
    return out


def check_layout(layout: Layout, model: Any, path: str) -> None:
    now = [(e["name"], e["numel"]) for e in layout_of(model)]
    saved = [(e["name"], e["numel"]) for e in layout]
    if now != saved:
        raise ValueError(f"checkpoint {path} holds flat parameters {saved}, the sharded model "
                         f"has {now} (a different model or wrapping policy)")


def read_shards(contents: Dict[str, Any], path: str, layout: Layout, saved_world: int,
                model: Any, optimizer: Any, rank: int, world_size: int
                ) -> Tuple[List[np.ndarray], Dict[str, np.ndarray]]:
    """This rank's new shard of every flat and its optimizer state arrays (``state.<i>.<key>``),
    cut from the saved pieces in ``contents``; nothing is changed yet."""
    check_layout(layout, model, path)
    flats = list(model.flat_shards())
    now = layout_of(model)
    needed = files_needed(layout, saved_world, rank, world_size, now, optimizer is not None)
    for name in sorted(needed):
        if name not in contents:
            raise CheckpointCorruptError(path, name, "missing")

    def piece(file_name: str, key: str) -> np.ndarray:
        if key not in contents[file_name]:
            raise CheckpointCorruptError(path, file_name, f"holds no {key!r}")
        return contents[file_name][key]

    shards = [_assemble(lambda q: piece(fmt.shard_files(q)[0], saved["name"]), saved,
                        saved_world, _held(current, rank, world_size), current["size"],
                        flat.shard.array.dtype)
              for flat, saved, current in zip(flats, layout, now)]
    arrays: Dict[str, np.ndarray] = {}
    if optimizer is not None:
        saved_keys = {key for name in needed if name.startswith("optimizer")
                      for key in contents[name]}
        for flat, saved, current, index in zip(flats, layout, now,
                                               _optimizer_index(optimizer, model)):
            for key in sorted(k for k in saved_keys if k.startswith(f"state.{index}.")):
                arrays[key] = _assemble(lambda q: piece(fmt.shard_files(q)[1], key), saved,
                                        saved_world, _held(current, rank, world_size),
                                        current["size"], flat.shard.array.dtype)
    return shards, arrays


def place_shards(model: Any, shards: List[np.ndarray]) -> None:
    for flat, values in zip(model.flat_shards(), shards):
        flat.shard.array[...] = values
    changed = getattr(model, "shards_changed", None)
    if callable(changed):  # full parameters gathered before the load are stale now
        changed()


def write_rank_shards(parent: str, name: str, model: Any, optimizer: Any, rank: int,
                      world_size: int, pg: Any) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Every rank writes its shard files into the checkpoint directory rank 0 begins; rank 0
    gets (that temporary directory, every rank's manifest entries) to finish it, the others
    None. Collective: a failure on any rank raises on every rank, naming it."""
    begun: Dict[str, Any] = {}
    if rank == 0:
        try:
            begun = {"temporary": fmt.begin_checkpoint_directory(parent, name)}
        except Exception as exc:
            if pg is None:
                raise
            begun = {"error": f"{type(exc).__name__}: {exc}"}
    if pg is not None:
        begun = exchange.broadcast_json(pg, begun)
    if "error" in begun:
        raise DistributedError(f"checkpoint {name} not saved: rank 0 could not begin it: "
                               f"{begun['error']}", rank=rank, op="save_checkpoint")
    temporary = begun["temporary"]
    try:
        files = shard_file_bytes(model, optimizer, rank, world_size)
        mine = {f: fmt.write_checkpoint_file(temporary, f, data) for f, data in files.items()}
    except Exception as exc:  # reported to every rank, so that none waits for this one
        if pg is None:
            raise
        mine = {"error": f"{type(exc).__name__}: {exc}"}
    listings = [mine] if pg is None else exchange.gather_json(pg, mine)
    failed = [(r, entry["error"]) for r, entry in enumerate(listings) if "error" in entry]
    if failed:
        if rank == 0:
            fmt.remove_temporary_directory(temporary)
        raise DistributedError(f"checkpoint {name} not saved: rank {failed[0][0]} could not "
                               f"write its shards: {failed[0][1]}", rank=rank,
                               peer=failed[0][0], op="save_checkpoint")
    if rank != 0:
        return None
    return temporary, {f: entry for listing in listings for f, entry in listing.items()}
