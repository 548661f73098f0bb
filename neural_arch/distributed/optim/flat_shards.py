"""The flat layout of ``ReduceScatterZeroOptimizer``: one parameter group's parameters of one
dtype back to back in one buffer, cut into ``world size`` equal contiguous shards.

Rank ``r`` owns elements ``[r * S, (r + 1) * S)`` of the concatenation, ``S`` the total
rounded up to a multiple of the world size over the world size (the last shards end in zero
padding). Every rank holds the whole flat buffer of parameters, and each parameter's ``.array``
is a view of it, so the all-gather of the updated shards writes straight into the parameters.
A second flat buffer receives the gradients, which the reduce-scatter averages shard by shard:
the owner of a shard gets its average, and the optimizer steps the shard, a view of the
parameter buffer, in place.
"""
from __future__ import annotations

from typing import Any, List, Sequence, Tuple

import numpy as np

from ...core import Tensor
from .. import collectives
from ..reduce_ops import ReduceOp
from .back_to_back import BackToBack


class FlatShards:
    """``params`` (host NumPy parameters, one dtype) laid flat over ``world_size`` shards."""

    def __init__(self, params: Sequence[Any], rank: int, world_size: int) -> None:
        for p in params:
            if type(p.array) is not np.ndarray:
                raise TypeError(
                    f"the reduce-scatter ZeRO-1 keeps parameters as views of one host buffer; "
                    f"got a {type(p.array).__module__}.{type(p.array).__name__} of shape "
                    f"{tuple(p.array.shape)}")
        self.params, self.rank, self.world_size = list(params), rank, world_size
        self.dtype = np.dtype(params[0].array.dtype)
        self.layout = BackToBack(self.params)
        self.offsets = self.layout.offsets
        self.numel = self.layout.numel
        self.shard_size = -(-self.numel // world_size)
        total = self.shard_size * world_size
        self.values = np.zeros(total, dtype=self.dtype)
        self.grads = np.zeros(total, dtype=self.dtype)
        self.views = []
        for p, lo, hi in zip(self.params, self.offsets, self.offsets[1:]):
            view = self.values[lo:hi].reshape(p.array.shape)
            view[...] = p.array
            p.array = view
            self.views.append(view)
        lo, hi = self.bounds(rank)
        # the shard the local optimizer steps: a view, updated in place
        self.shard = Tensor(np.zeros(0, self.dtype), requires_grad=True)
        self.shard.array = self.values[lo:hi]

    def bounds(self, rank: int) -> Tuple[int, int]:
        return rank * self.shard_size, (rank + 1) * self.shard_size

    def reattach(self) -> None:
        """Parameters whose ``.array`` was rebound (a model's ``load_state_dict``, say) become
        views again, holding the values they were given."""
        for p, view in zip(self.params, self.views):
            if p.array is not view:
                view[...] = p.array
                p.array = view
        lo, hi = self.bounds(self.rank)
        if self.shard.array.base is not self.values:
            self.values[lo:hi] = self.shard.array
            self.shard.array = self.values[lo:hi]

    def reduce_gradients(self, group: Any) -> None:
        """Pack every gradient (None counts as zeros) and reduce-scatter their average: the
        shard's ``.grad`` is this rank's part of the averaged gradient. The parameters'
        gradients are dropped: the flat buffer holds them now."""
        self.layout.pack([None if p.grad is None else p.grad.array for p in self.params],
                         self.grads[:self.numel])
        for p in self.params:
            p.grad = None
        # made for each call: between steps a rank holds no second copy of its shard
        reduced = np.empty(self.shard_size, dtype=self.dtype)
        collectives.reduce_scatter_tensor(reduced, self.grads, ReduceOp.AVERAGE, group=group)
        lo, hi = self.bounds(self.rank)
        mine = self.grads[lo:hi]
        mine[...] = reduced
        self.shard.grad = mine

    def gather_parameters(self, group: Any) -> None:
        """Every rank's updated shard into every rank's parameters."""
        self.reattach()
        lo, hi = self.bounds(self.rank)
        # in place, as torch's: the input is this rank's block of the output
        collectives.all_gather_into_tensor(self.values, self.values[lo:hi], group=group)
        for p in self.params:
            p.mark_modified_in_place()  # every parameter is a view of the buffer just written

    # ----- optimizer state: flat shards <-> one entry per parameter -------------------------
    def owned_pieces(self) -> List[Tuple[int, int, int, int]]:
        """(parameter index, start in the parameter, stop, start in the shard) for each part
        of a parameter inside this rank's shard."""
        lo, hi = self.bounds(self.rank)
        pieces = []
        for i, (a, b) in enumerate(zip(self.offsets, self.offsets[1:])):
            start, stop = max(a, lo), min(b, hi)
            if start < stop:
                pieces.append((i, start - a, stop - a, start - lo))
        return pieces


def is_elementwise(value: Any, shard_size: int) -> bool:
    """Whether a state value holds one number per shard element (Adam's moments, momentum)."""
    return isinstance(value, np.ndarray) and value.ndim == 1 and value.size == shard_size
