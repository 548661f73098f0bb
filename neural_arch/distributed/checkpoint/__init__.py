"""Checkpoints of data-parallel training that survive crashes, and resuming from them.

``manager`` saves, rotates and restores checkpoints (``DistributedCheckpointManager``,
``setup_fault_tolerant_training``); ``format`` is the on-disk format (JSON, safetensors, a
manifest of checksums, atomic writes), ``state`` turns live training objects into checkpoint
files and back, ``directory`` decides which checkpoints in a directory are good and kept, and
``choice`` which one a group (or ranks saving into several directories) resumes from.
"""
from __future__ import annotations

from .manager import (CheckpointCorruptError, CheckpointError, DistributedCheckpointManager,
                      NoCheckpointError, setup_fault_tolerant_training)

__all__ = ["CheckpointCorruptError", "CheckpointError", "DistributedCheckpointManager",
           "NoCheckpointError", "setup_fault_tolerant_training"]
