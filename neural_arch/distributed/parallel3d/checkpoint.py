"""Checkpoints of a ``GPT3D``: each rank's piece on its own, readable back on the same mesh or
as one dense GPT by a single process.

A piece is what one (tp, pipeline stage) position holds: its stage's parameters, with the
tensor-parallel ones as this rank's shard. The dp replicas hold the same piece, so only dp rank
0 writes it (``model.shard.tp<t>.vs<s>.safetensors``) with its optimizer state
(``optimizer.shard.tp<t>.vs<s>.safetensors``; a ZeRO-1 optimizer is consolidated onto dp rank
0 first). Keys are the dense GPT's (``h.<global block>.…``), so that ``meta.json``'s table of
layouts — which dimension of each key is split across tp, and in how many packed blocks — is
all a reader needs to rebuild the dense arrays (``load_dense_checkpoint``).

The directory is written as every checkpoint here (``checkpoint.format``): rank 0 begins it,
the writers add their files, rank 0 writes the manifest of everyone's SHA-256 and moves it into
place; a reader checks each file it reads against the manifest. Nothing is pickled.
"""
from __future__ import annotations

import dataclasses
import os
from collections import OrderedDict
from typing import Any, Dict, List, Tuple

import numpy as np

from ..checkpoint import exchange
from ..checkpoint import format as fmt
from ..checkpoint.state import pack_optimizer, unpack_optimizer
from ..errors import DistributedError
from ..group.world import resolve_group
from ..tensor_parallel.layout import Layout

KIND = "gpt3d"


def piece_files(tp_rank: int, stage: int) -> Tuple[str, str]:
    return (f"model.shard.tp{tp_rank}.vs{stage}.safetensors",
            f"optimizer.shard.tp{tp_rank}.vs{stage}.safetensors")


def _dense_key(key: str, offset: int) -> str:
    """A stage's ``h.<k>.…`` is block ``offset + k`` of the whole model."""
    if key.startswith("h."):
        head, rest = key[2:].split(".", 1)
        return f"h.{offset + int(head)}.{rest}"
    return key


def _layouts(piece: Any, offset: int) -> Dict[str, List[int]]:
    """``{dense key: [dim, stride]}`` for the piece's tensor-parallel parameters."""
    table = {}
    for prefix, module in piece.named_modules():
        for name, layout in (getattr(module, "tp_layout", None) or {}).items():
            if layout is not None:
                key = f"{prefix}.{name}" if prefix else name
                table[_dense_key(key, offset)] = [int(layout.dim), int(layout.stride)]
    return table


def _optimizer_state(model: Any) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    optimizer = model.optimizer
    if model.data_parallel == "zero1":
        optimizer.consolidate_state_dict(to=model.dp_group.ranks[0])
        if model.dp_rank != 0:
            return {}, {}
    return pack_optimizer(optimizer)


def _my_files(model: Any) -> Tuple[Dict[str, bytes], Dict[str, Any]]:
    """This rank's files and its entry for meta.json (nothing from a dp replica but rank 0)."""
    arrays, optimizer_meta = _optimizer_state(model)  # collective over dp under ZeRO-1
    if model.dp_rank != 0:
        return {}, {}
    files, entry = {}, {}
    for piece, stage, offset in zip(model.pieces, model.stage_indices, model.block_offsets):
        state = {_dense_key(k, offset): v for k, v in piece.state_dict().items()}
        model_file, _ = piece_files(model.tp_rank, stage)
        files[model_file] = fmt.safetensors_bytes(state)
        entry[f"tp{model.tp_rank}.vs{stage}"] = {
            "model": model_file, "stage": stage, "tp_rank": model.tp_rank,
            "keys": list(state), "layouts": _layouts(piece, offset)}
    # one optimizer covers every chunk of this rank: it goes with the first chunk's name
    _, optimizer_file = piece_files(model.tp_rank, model.stage_indices[0])
    files[optimizer_file] = fmt.safetensors_bytes(arrays)
    entry["optimizer"] = {"file": optimizer_file, "meta": optimizer_meta}
    return files, entry


def save_pieces(model: Any, parent: str, name: str) -> str:
    """Every rank calls it; returns the checkpoint's path (on every rank)."""
    world = resolve_group(None)
    begun: Dict[str, Any] = {}
    if world.rank == 0:
        os.makedirs(parent, exist_ok=True)
        begun = {"temporary": fmt.begin_checkpoint_directory(parent, name)}
    begun = exchange.broadcast_json(world, begun)
    temporary = begun["temporary"]
    try:
        files, entry = _my_files(model)
        listing = {f: fmt.write_checkpoint_file(temporary, f, data) for f, data in files.items()}
        report = {"listing": listing, "entry": entry, "rank": world.rank}
    except Exception as exc:  # told to every rank, so that none waits for this one
        report = {"error": f"{type(exc).__name__}: {exc}", "rank": world.rank}
    reports = exchange.gather_json(world, report)
    if world.rank == 0:
        failed = [r for r in reports if "error" in r]
        if failed:
            fmt.remove_temporary_directory(temporary)
        else:
            listing, pieces, optimizers = {}, {}, {}
            for r in reports:
                listing.update(r["listing"])
                entry = dict(r["entry"])
                if entry:
                    optimizers[str(r["rank"])] = entry.pop("optimizer")
                    pieces.update(entry)
            meta = {"kind": KIND, "step": model.steps,
                    "mesh": {"dp": model.dp, "tp": model.tp, "pp": model.pp},
                    "schedule": model.schedule_name, "chunks": model.chunks,
                    "config": dataclasses.asdict(model.config), "pieces": pieces,
                    "optimizers": optimizers}
            data = fmt.json_bytes(meta)
            listing[fmt.META] = fmt.write_checkpoint_file(temporary, fmt.META, data)
            fmt.finish_checkpoint_directory(parent, name, temporary, listing)
        outcome = {"failed": [[r["rank"], r["error"]] for r in failed]}
    else:
        outcome = {}
    outcome = exchange.broadcast_json(world, outcome)
    if outcome["failed"]:
        rank, error = outcome["failed"][0]
        raise DistributedError(f"GPT3D checkpoint {name} not saved: rank {rank} could not "
                               f"write its piece: {error}", rank=world.rank, peer=rank,
                               op="save_checkpoint")
    return os.path.join(parent, name)


def load_pieces(model: Any, path: str) -> None:
    """This rank's piece (and optimizer state) from a checkpoint of the same mesh shape."""
    model_files = [piece_files(model.tp_rank, s)[0] for s in model.stage_indices]
    # the optimizer state was written by this position's dp rank 0
    _, optimizer_file = piece_files(model.tp_rank, model.stage_indices[0])
    contents = fmt.read_checkpoint_directory(path, set(model_files) | {optimizer_file})
    meta = contents[fmt.META]
    saved = meta.get("mesh")
    mine = {"dp": model.dp, "tp": model.tp, "pp": model.pp}
    if meta.get("kind") != KIND or saved != mine or meta.get("chunks") != model.chunks:
        raise ValueError(f"{path} holds a {meta.get('kind')} checkpoint of mesh {saved} with "
                         f"{meta.get('chunks')} chunk(s) per rank; this GPT3D has mesh {mine} "
                         f"and {model.chunks}: load it with load_dense_checkpoint instead")
    for piece, stage, offset, file in zip(model.pieces, model.stage_indices,
                                          model.block_offsets, model_files):
        arrays = contents[file]
        local = OrderedDict()
        for key in piece.state_dict():
            dense_key = _dense_key(key, offset)
            if dense_key not in arrays:
                raise fmt.CheckpointCorruptError(path, file, f"no entry {dense_key!r}")
            local[key] = arrays[dense_key]
        piece.load_state_dict(local)
    writer = next(int(r) for r, o in meta["optimizers"].items() if o["file"] == optimizer_file)
    optimizer_meta = meta["optimizers"][str(writer)]["meta"]
    # a ZeRO-1 optimizer takes the consolidated state and keeps its own share of it
    unpack_optimizer(model.optimizer, optimizer_meta, contents[optimizer_file])
    model.steps = int(meta["step"])


def load_dense_checkpoint(path: str) -> Tuple[Dict[str, Any], "OrderedDict[str, np.ndarray]"]:
    """``(GPTConfig fields, dense state dict)`` rebuilt from every piece of a GPT3D checkpoint,
    in one process: ``GPT(GPTConfig(**fields)).load_state_dict(state)``."""
    contents = fmt.read_checkpoint_directory(path)
    meta = contents[fmt.META]
    if meta.get("kind") != KIND:
        raise ValueError(f"{path} is not a GPT3D checkpoint (kind {meta.get('kind')!r})")
    tp = int(meta["mesh"]["tp"])
    shards: Dict[str, Dict[int, np.ndarray]] = {}
    layouts: Dict[str, List[int]] = {}
    # pieces in stage order, each key in its module order: the dense GPT's state order
    for piece in sorted(meta["pieces"].values(), key=lambda e: (e["stage"], e["tp_rank"])):
        layouts.update(piece["layouts"])
        arrays = contents[piece["model"]]
        for key in piece["keys"]:
            shards.setdefault(key, {})[int(piece["tp_rank"])] = arrays[key]
    dense: "OrderedDict[str, np.ndarray]" = OrderedDict()
    for key in shards:
        held = shards[key]
        if key not in layouts:  # replicated over tp: every rank's copy is the same
            dense[key] = held[min(held)]
            continue
        missing = sorted(set(range(tp)) - set(held))
        if missing:
            raise fmt.CheckpointCorruptError(path, "", f"{key!r} lacks the shards of tp ranks "
                                             f"{missing}")
        dim, stride = layouts[key]
        dense[key] = Layout(dim, stride).unshard([held[r] for r in range(tp)])
    return meta["config"], dense

