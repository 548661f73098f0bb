"""``neural_arch.utils``: torch's ``torch.utils`` paths, pointing at this framework's modules.

Only ``utils.data`` lives here (the datasets and loaders of ``neural_arch.data``, and
``utils.data.distributed.DistributedSampler``), so that a ported script's import lines map one
to one. ``utils`` is a face above ``data`` and ``distributed``, not a layer of its own.
"""
from . import data

__all__ = ["data"]
