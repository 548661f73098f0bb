"""Names in a checkpoint directory: the checkpoints' own (``ckpt-e<epoch>-s<step>``), their
temporaries while written or removed (``<name>.tmp-<writer>-<random>``,
``<name>.old-<writer>-<random>``, ``<writer>`` the process doing it, see ``owner``), and the
files inside one. ``format`` writes and reads the directories these name.
"""
from __future__ import annotations

import re
import secrets
from typing import Optional, Tuple

from . import owner

MANIFEST = "manifest.json"
META = "meta.json"
MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
# A sharded model's checkpoint holds each rank's pieces in files of their own.
_MODEL_SHARD = "model.shard{}.safetensors"
_OPTIMIZER_SHARD = "optimizer.shard{}.safetensors"
_NAME = re.compile(r"^ckpt-e(\d+)-s(\d+)$")
# Temporaries written before writers were recorded have no ``<writer>-`` part.
_TEMPORARY = re.compile(rf"^ckpt-e\d+-s\d+\.(?:tmp|old)-(?:({owner.PATTERN})-)?[0-9a-f]+$")


def checkpoint_name(epoch: int, step: int) -> str:
    return f"ckpt-e{epoch:06d}-s{step:08d}"


def parse_checkpoint_name(name: str) -> Optional[Tuple[int, int]]:
    """(epoch, step) of a finished checkpoint directory name, else None."""
    match = _NAME.match(name)
    return (int(match.group(1)), int(match.group(2))) if match else None


def is_temporary_name(name: str) -> bool:
    return _TEMPORARY.match(name) is not None


def temporary_name(name: str, kind: str) -> str:
    """A fresh temporary name for checkpoint ``name``: ``kind`` "tmp" while it is written,
    "old" while it is removed; it records the calling process as its writer."""
    if kind not in ("tmp", "old"):
        raise ValueError(f"kind must be 'tmp' or 'old', got {kind!r}")
    return f"{name}.{kind}-{owner.this_process()}-{secrets.token_hex(4)}"


def temporary_writer(name: str) -> Optional[owner.Writer]:
    """The writer recorded in a temporary directory's name; None when it records none."""
    match = _TEMPORARY.match(name)
    if match is None:
        raise ValueError(f"{name!r} is not a temporary checkpoint directory name")
    return None if match.group(1) is None else owner.Writer.parse(match.group(1))


def rank_file(rank: int) -> str:
    return f"rank{rank}.json"


def shard_files(rank: int) -> Tuple[str, str]:
    """The files holding rank ``rank``'s model and optimizer shards."""
    return _MODEL_SHARD.format(rank), _OPTIMIZER_SHARD.format(rank)


def is_per_rank_file(file_name: str) -> bool:
    """Files that one rank's load may skip: other ranks' states and shards."""
    return file_name.startswith("rank") or ".shard" in file_name
