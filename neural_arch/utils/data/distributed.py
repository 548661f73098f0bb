"""``neural_arch.utils.data.distributed``: torch's path to ``DistributedSampler``.

The sampler is ``neural_arch.distributed``'s own; it accepts a dataset, as torch's does (or
just its length), and reads the rank and world size from the initialized process group.
"""
from ...distributed.ddp.sampler import DistributedSampler

__all__ = ["DistributedSampler"]
