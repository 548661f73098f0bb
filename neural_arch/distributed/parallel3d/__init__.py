"""Data, tensor and pipeline parallelism together: ``GPT3D`` trains one GPT on a dp x tp x pp
device mesh; its checkpoints hold each rank's piece and load back on the same mesh, or into a
dense GPT in one process (``load_dense_checkpoint``)."""
from __future__ import annotations

from .checkpoint import load_dense_checkpoint
from .gpt import GPT3D

__all__ = ["GPT3D", "load_dense_checkpoint"]
