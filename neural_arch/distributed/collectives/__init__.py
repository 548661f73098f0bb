"""The public collectives, with PyTorch's signatures and semantics, one idea per module:

- ``tensors``: the collectives every rank takes part in alike (``all_reduce``, ``broadcast``,
  ``all_gather``, ``reduce_scatter``, ``barrier``), with the short path of small calls;
- ``rooted``: the ones with a root rank (``reduce``, ``gather``, ``scatter``);
- ``args``: the argument checks both share;
- ``objects``: the same over picklable objects (``all_gather_object``, ...);
- ``point_to_point``: ``send``/``recv``, ``isend``/``irecv`` and ``batch_isend_irecv``.

This package holds the whole API: ``from neural_arch.distributed import collectives`` then
``collectives.all_reduce(...)``, as before the modules were split.
"""
from __future__ import annotations

from .objects import all_gather_object, broadcast_object_list, gather_object
from .point_to_point import recv, send
from .rooted import gather, reduce, scatter
from .tensors import (all_gather, all_gather_into_tensor, all_reduce, barrier, broadcast,
                      reduce_scatter, reduce_scatter_tensor)

__all__ = ["all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "barrier",
           "broadcast", "broadcast_object_list", "gather", "gather_object", "recv", "reduce",
           "reduce_scatter", "reduce_scatter_tensor", "scatter", "send"]
