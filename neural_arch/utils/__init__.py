"""``neural_arch.utils``: torch's ``torch.utils`` paths, pointing at this framework's modules.

``utils.data`` holds the datasets and loaders of ``neural_arch.data`` (and
``utils.data.distributed.DistributedSampler``), so that a ported script's import lines map one
to one; ``utils.checkpoint.checkpoint`` is activation checkpointing. ``utils`` is a face above
``data``, ``nn`` and ``distributed``, not a layer of its own.
"""
from . import checkpoint, data

__all__ = ["checkpoint", "data"]
