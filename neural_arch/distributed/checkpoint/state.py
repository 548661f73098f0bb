"""Live training objects to checkpoint files and back (model, optimizer, scheduler, loss
scaler, sampler, the global random generators), and the exchange of per-rank state.

Optimizer state arrays go to ``optimizer.safetensors`` under ``state.<param index>.<name>``
(the parameter index of PyTorch's ``state_dict`` layout); its scalars and hyper-parameters go
to ``meta.json`` with the rest of the shared state. Per-rank state (RNG, sampler) goes to
``rank<r>.json``.
"""
from __future__ import annotations

import hashlib
import json
import math
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from ...core.random import get_rng
from ...nn import Module
from . import format as fmt
from . import sharded as sharded_io
from .format import CheckpointCorruptError
from .values import decode, encode, host_array, is_array


def unwrap_model(model: Any) -> Any:
    """The model inside data-parallel wrappers: a ``.module`` holding all of the wrapper's
    state, so saved keys carry no ``module.`` prefix."""
    while isinstance(getattr(model, "module", None), Module):
        if isinstance(model, Module):
            names = [n for n, _ in model.named_parameters()] + [n for n, _ in
                                                                model.named_buffers()]
            if not all(n.startswith("module.") for n in names):
                break
        model = model.module
    return model


# ----- random generators -------------------------------------------------------------------------
def capture_rng() -> Dict[str, Any]:
    """The framework's global generator and NumPy's legacy global state, JSON-ready."""
    return {"framework": encode(get_rng().bit_generator.state),
            "numpy_legacy": encode(np.random.get_state(legacy=False))}


def restore_rng(saved: Dict[str, Any]) -> None:
    """Set both global generators in place (objects that hold them see the new state)."""
    framework = decode(saved["framework"])
    bit_generator = get_rng().bit_generator
    if framework["bit_generator"] != type(bit_generator).__name__:
        raise ValueError(f"checkpoint holds a {framework['bit_generator']} generator state, the "
                         f"global generator is a {type(bit_generator).__name__}")
    bit_generator.state = framework
    np.random.set_state(decode(saved["numpy_legacy"]))


def derive_rng(reference: Dict[str, Any], rank: int) -> Dict[str, Any]:
    """RNG states for a rank the checkpoint has no file for (the job grew).

    They are seeded from the SHA-256 of the reference rank's saved states and the rank index,
    so every relaunch gives the same rank the same streams, distinct from every other rank's.
    """
    digest = hashlib.sha256(json.dumps(reference, sort_keys=True).encode()).digest()
    seeds = np.random.SeedSequence(int.from_bytes(digest, "little"), spawn_key=(rank,))
    framework_seed, legacy_seed = seeds.spawn(2)
    kind = decode(reference["framework"])["bit_generator"]
    bit_generator = getattr(np.random, kind)(framework_seed)
    legacy = np.random.RandomState(np.random.MT19937(legacy_seed))
    return {"framework": encode(bit_generator.state),
            "numpy_legacy": encode(legacy.get_state(legacy=False))}


# ----- optimizer ---------------------------------------------------------------------------------
def pack_optimizer(optimizer: Any) -> Tuple[Dict[str, np.ndarray], Dict[str, Any]]:
    """(arrays for ``optimizer.safetensors``, JSON-ready scalars and hyper-parameters)."""
    state_dict = optimizer.state_dict()
    arrays: Dict[str, np.ndarray] = {}
    scalars: Dict[str, Dict[str, Any]] = {}
    for index, entry in state_dict["state"].items():
        kept = {}
        for key, value in entry.items():
            if is_array(value):
                arrays[f"state.{int(index)}.{key}"] = host_array(value)
            else:
                kept[key] = value
        scalars[str(int(index))] = kept
    meta = {"class": type(optimizer).__name__, "state": encode(scalars, "optimizer state"),
            "param_groups": encode(state_dict["param_groups"], "optimizer param_groups")}
    return arrays, meta


def unpack_optimizer(optimizer: Any, meta: Dict[str, Any], arrays: Dict[str, np.ndarray]) -> None:
    if meta["class"] != type(optimizer).__name__:
        raise ValueError(f"checkpoint holds {meta['class']} state, the optimizer is a "
                         f"{type(optimizer).__name__}")
    state: Dict[int, Dict[str, Any]] = {int(i): dict(s) for i, s in decode(meta["state"]).items()}
    for name, array in arrays.items():
        _, index, key = name.split(".", 2)
        state.setdefault(int(index), {})[key] = array
    optimizer.load_state_dict({"state": state, "param_groups": decode(meta["param_groups"])})


# ----- whole checkpoints -------------------------------------------------------------------------
def rank_state(rank: int, epoch: int, step: int, sampler: Any) -> Dict[str, Any]:
    """What one rank contributes: its counters (checked for agreement), RNG and sampler."""
    return {"epoch": epoch, "step": step, "rank": rank, "rng": capture_rng(),
            "sampler": None if sampler is None else encode(sampler.state_dict(), "sampler state")}


def build_files(ranks: List[Dict[str, Any]], model: Any, optimizer: Any, epoch: int, step: int,
                loss: Optional[float], best_loss: float, world_size: int, additional_state: Any,
                scheduler: Any, loss_scaler: Any) -> Dict[str, bytes]:
    """File name -> bytes of a whole checkpoint (the manifest is added when writing)."""
    files: Dict[str, bytes] = {}
    inner = None if model is None else unwrap_model(model)
    sharded = inner is not None and sharded_io.is_sharded(inner)
    if sharded:  # the shards are in every rank's own files; here its buffers, if any
        files[fmt.MODEL_FILE] = fmt.safetensors_bytes(dict(inner.named_buffers()))
    elif inner is not None:
        files[fmt.MODEL_FILE] = fmt.safetensors_bytes(inner.state_dict())
    optimizer_meta = None
    if optimizer is not None:
        arrays, optimizer_meta = pack_optimizer(optimizer)
        if not sharded:  # a sharded model's optimizer arrays are in the shard files
            files[fmt.OPTIMIZER_FILE] = fmt.safetensors_bytes(arrays)
    meta = {"format": fmt.FORMAT, "version": fmt.VERSION, "epoch": epoch, "step": step,
            "loss": encode(loss), "best_loss": encode(best_loss), "world_size": world_size,
            "model": model is not None, "optimizer": optimizer_meta,
            "scheduler": None if scheduler is None
            else encode(scheduler.state_dict(), "scheduler state"),
            "loss_scaler": None if loss_scaler is None
            else encode(loss_scaler.state_dict(), "loss scaler state"),
            "additional_state": encode(additional_state, "additional_state"),
            "sharded": {"layout": sharded_io.layout_of(inner)} if sharded else None}
    files[fmt.META] = fmt.json_bytes(meta)
    for state in ranks:
        files[fmt.rank_file(state["rank"])] = fmt.json_bytes(
            {"rank": state["rank"], "rng": state["rng"], "sampler": state["sampler"]})
    return files


def apply_contents(contents: Dict[str, Any], path: str, rank: int, model: Any, optimizer: Any,
                   scheduler: Any, loss_scaler: Any, sampler: Any,
                   restore_rng_state: bool, world_size: int = 1) -> Dict[str, Any]:
    """Load verified checkpoint contents into the given objects; returns the saved counters."""
    meta = contents[fmt.META]
    inner = None if model is None else unwrap_model(model)
    shards = None
    if model is not None and bool(meta.get("sharded")) != sharded_io.is_sharded(inner):
        saved = "a sharded model" if meta.get("sharded") else "a full model"
        raise ValueError(f"checkpoint {path} holds {saved}, the model is a "
                         f"{type(inner).__name__}: load a sharded checkpoint into the same "
                         "sharded wrapper (any world size), a full one into the plain model")

    def part(key: str, what: str) -> Any:
        if meta.get(key) is None:
            raise ValueError(f"checkpoint {path} holds no {what} state")
        return meta[key]

    # Everything asked for must be there before anything is overwritten.
    if model is not None and (not meta.get("model") or fmt.MODEL_FILE not in contents):
        raise ValueError(f"checkpoint {path} holds no model weights")
    if meta.get("sharded") and (model is not None or optimizer is not None):
        if model is None:
            raise ValueError(f"checkpoint {path} is sharded: its optimizer state can only be "
                             "loaded together with the sharded model")
        shards, shard_arrays = sharded_io.read_shards(
            contents, path, meta["sharded"]["layout"], meta["world_size"], inner, optimizer,
            rank, world_size)
    if optimizer is not None and part("optimizer", "optimizer")["class"] != \
            type(optimizer).__name__:
        raise ValueError(f"checkpoint {path} holds {meta['optimizer']['class']} state, the "
                         f"optimizer is a {type(optimizer).__name__}")
    for obj, key, what in ((scheduler, "scheduler", "scheduler"),
                           (loss_scaler, "loss_scaler", "loss scaler")):
        if obj is not None:
            part(key, what)
    own = contents.get(fmt.rank_file(rank))
    if own is None:
        if rank < meta["world_size"]:
            raise CheckpointCorruptError(path, fmt.rank_file(rank), "missing")
        reference = contents[fmt.rank_file(0)]
        own = {"rng": derive_rng(reference["rng"], rank), "sampler": reference["sampler"]}
    if sampler is not None and own["sampler"] is None:
        raise ValueError(f"checkpoint {path} holds no sampler state")

    if shards is not None:
        sharded_io.place_shards(inner, shards)
        for name, buffer in inner.named_buffers():
            buffer[...] = contents[fmt.MODEL_FILE][name]
    elif model is not None:
        inner.load_state_dict(contents[fmt.MODEL_FILE])
    if optimizer is not None:
        arrays = shard_arrays if shards is not None else contents[fmt.OPTIMIZER_FILE]
        unpack_optimizer(optimizer, meta["optimizer"], arrays)
    if scheduler is not None:
        scheduler.load_state_dict(decode(meta["scheduler"]))
    if loss_scaler is not None:
        loss_scaler.load_state_dict(decode(meta["loss_scaler"]))
    if sampler is not None:
        sampler.load_state_dict(decode(own["sampler"]))
    if restore_rng_state:
        restore_rng(own["rng"])
    return {"epoch": meta["epoch"], "step": meta["step"], "loss": decode(meta["loss"]),
            "best_loss": decode(meta.get("best_loss", math.inf)),
            "world_size": meta["world_size"],
            "additional_state": decode(meta["additional_state"]), "path": path}
