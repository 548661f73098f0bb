"""How ``ZeroRedundancyOptimizer`` splits the parameters over the ranks, and how each rank's
updated shard reaches every other rank.

``partition_parameters`` is PyTorch's greedy rule. ``ShardExchange`` keeps, per dtype, one
host buffer of ``world size`` equal pieces, piece ``r`` holding rank ``r``'s parameters of that
dtype back to back (zero-padded up to the largest piece). After the local step a rank packs
its own parameters into its piece and one ``all_gather_into_tensor`` per dtype fills in every
other piece: a handful of large messages per step instead of one broadcast per parameter.
The greedy split keeps the pieces nearly equal, so the padding is small.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

import numpy as np

from .. import collectives
from ..buffers import copy_from_host, copy_into_host

Partition = List[List[List[Any]]]  # rank -> parameter group -> parameters


def partition_parameters(param_groups: Sequence[Dict[str, Any]], world_size: int) -> Partition:
    """Assign every parameter to one rank: within each group the largest first (ties keep the
    group's order), each onto the rank holding the fewest elements so far (ties: the lowest
    rank). The totals carry over from group to group, so a group added later leaves the
    earlier groups' assignment unchanged. The result depends only on the shapes, so every rank
    computes the same partition."""
    loads = [0] * world_size
    partition: Partition = [[] for _ in range(world_size)]
    for group in param_groups:
        shares: List[List[Any]] = [[] for _ in range(world_size)]
        for param in sorted(group["params"], key=lambda p: p.array.size, reverse=True):
            rank = loads.index(min(loads))
            shares[rank].append(param)
            loads[rank] += param.array.size
        for rank in range(world_size):
            partition[rank].append(shares[rank])
    return partition


class _Slot:
    """One dtype: the gathered buffer, the size of each rank's piece, and where each parameter
    lies."""

    def __init__(self, dtype: np.dtype, piece: int, world_size: int) -> None:
        self.dtype, self.piece = dtype, piece
        self.gathered = np.zeros(world_size * piece, dtype=dtype)
        self.mine: List[tuple] = []    # (param, start, stop, view or None) within the piece sent
        self.others: List[tuple] = []  # (param, start, stop, view or None) within ``gathered``


class ShardExchange:
    """Makes every replica hold every rank's updated parameters; see the module docstring.

    ``as_views=True`` (PyTorch's ``parameters_as_bucket_view``) makes each parameter's
    ``.array`` a view into the gathered buffer, so the all-gather writes the new values
    straight into the parameters and nothing is unpacked. A parameter whose ``.array`` was
    rebound since (by a model's ``load_state_dict``, say) is made a view again, holding its
    owner's values.
    """

    def __init__(self, partition: Partition, rank: int, group: Any, as_views: bool) -> None:
        self.rank, self.group = rank, group
        world_size = len(partition)
        owned = [[p for share in groups for p in share] for groups in partition]
        slots: Dict[np.dtype, _Slot] = {}
        # dtypes in order of first appearance over ranks and parameters: the same on every rank
        for dtype in dict.fromkeys(np.dtype(p.array.dtype) for params in owned for p in params):
            sizes = [sum(p.array.size for p in params if p.array.dtype == dtype) for params in owned]
            if max(sizes):
                slots[dtype] = _Slot(dtype, max(sizes), world_size)
        for owner, params in enumerate(owned):
            offsets = {dtype: 0 for dtype in slots}
            for param in params:
                dtype = np.dtype(param.array.dtype)
                if dtype not in slots:
                    continue  # empty parameters: nothing to send
                slot, start = slots[dtype], offsets[dtype]
                stop = start + param.array.size
                offsets[dtype] = stop
                base = owner * slot.piece
                view = None
                if as_views:
                    view = _as_view(param, slot.gathered[base + start:base + stop])
                if owner == rank:
                    slot.mine.append((param, start, stop, view))
                else:
                    slot.others.append((param, base + start, base + stop, view))
        self.slots = list(slots.values())

    def exchange(self) -> None:
        """Send this rank's parameters to all, receive everyone else's (one collective per
        dtype, all ranks in the same order). A bucket-view parameter whose ``.array`` was
        rebound is pointed back at its view, which the all-gather has just filled."""
        for slot in self.slots:
            # This rank's piece of the gathered buffer is what it sends (an in-place
            # all-gather, as torch's): a parameter that is a view of it is there already.
            lo = self.rank * slot.piece
            send = slot.gathered[lo:lo + slot.piece]
            for param, start, stop, view in slot.mine:
                if view is None or param.array is not view:
                    copy_into_host(send[start:stop], param.array)
            collectives.all_gather_into_tensor(slot.gathered, send, group=self.group)
            for param, _, _, view in slot.mine:
                if view is not None:
                    param.array = view
            for param, start, stop, view in slot.others:
                if view is not None:
                    param.array = view
                else:
                    values = slot.gathered[start:stop].reshape(param.array.shape)
                    copy_from_host(values, param.array, out=param.array)
                param.mark_modified_in_place()  # another rank's update, written in place


def _as_view(param: Any, flat: np.ndarray) -> np.ndarray:
    """Bucket-view mode: ``param.array`` becomes a view of ``flat`` holding its values."""
    if type(param.array) is not np.ndarray:
        raise ValueError(
            f"parameters_as_bucket_view=True needs host NumPy parameters, got a "
            f"{type(param.array).__module__}.{type(param.array).__name__} of shape "
            f"{tuple(param.array.shape)}")
    view = flat.reshape(param.array.shape)
    view[...] = param.array
    param.array = view
    return view
