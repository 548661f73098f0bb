"""Where the owners' parameters live when ``ZeroRedundancyOptimizer(overlap_with_ddp=True)``
passes its updates through shared memory (DDP's shared buckets, ``overlap_step``).

One segment, mapped by every rank of the group, holds each assignment's parameters back to
back (``back_to_back``), cache-line aligned. On the rank that owns an assignment, those
parameters' ``.array`` are views of its place in the segment: the local optimizer updates them
there, in place, and the other ranks copy the new values straight out of it, so an update
costs one copy on each reader and none on the owner. A parameter whose ``.array`` was rebound
since (a model's ``load_state_dict``, say) becomes a view again, holding the values it was
given, before the next update; one that cannot be a view (a GPU array) is copied into its
place after the update.

The segment is unlinked as soon as every rank has mapped it, so nothing outlives the ranks.
"""
from __future__ import annotations

from typing import Any, List, Sequence

import numpy as np

from ..buffers import copy_into_host
from ..ddp.shared_segment import ALIGN_BYTES, SharedBucketsUnavailable, open_segment, round_up
from .back_to_back import BackToBack
from .bucket_assignment import Assignment

OP = "zero_shared_updates"


class SharedUpdates:
    """Each assignment's parameters in one shared segment (see the module docstring); open
    it with ``SharedUpdates.open``, on every rank at the same point."""

    def __init__(self, mm: Any, assignments: Sequence[Assignment],
                 layouts: Sequence[BackToBack], rank: int) -> None:
        self._mm = mm  # the views below keep the mapping alive
        self._assignments, self._layouts, self._rank = list(assignments), list(layouts), rank
        raw = np.frombuffer(mm, np.uint8)
        self._places: List[np.ndarray] = []
        for at, layout in zip(_starts(layouts), layouts):
            size = layout.numel * np.dtype(layout.dtype).itemsize
            self._places.append(raw[at:at + size].view(layout.dtype))
        # the views each owned parameter should be (None: not one of this rank's)
        self._views: List[Any] = []
        for assignment, layout, place in zip(self._assignments, self._layouts, self._places):
            if assignment.rank != rank:
                self._views.append(None)
                continue
            self._views.append([place[lo:hi].reshape(p.array.shape) for p, lo, hi
                                in zip(layout.params, layout.offsets, layout.offsets[1:])])

    @classmethod
    def open(cls, group: Any, assignments: Sequence[Assignment],
             layouts: Sequence[BackToBack], rank: int):
        """The segment of every rank of ``group``, or None on every rank where shared memory
        would not have it (the caller then passes the updates another way)."""
        total = max(sum(round_up(layout.numel * np.dtype(layout.dtype).itemsize, ALIGN_BYTES)
                        for layout in layouts), ALIGN_BYTES)
        try:
            _, mm = open_segment(group, total, OP)
        except SharedBucketsUnavailable:
            return None
        return cls(mm, assignments, layouts, rank)

    def place(self, number: int) -> np.ndarray:
        """Assignment ``number``'s parameters, back to back (its owner's latest values once
        it published them)."""
        return self._places[number]

    def before_update(self, number: int) -> None:
        """This rank owns assignment ``number``: make its parameters views of their place."""
        for param, view in zip(self._layouts[number].params, self._views[number]):
            if param.array is view:
                continue
            if type(param.array) is not np.ndarray or param.array.dtype != view.dtype:
                continue  # copied over by after_update
            view[...] = param.array
            param.array = view

    def after_update(self, number: int) -> None:
        """Values of parameters that are not views (GPU arrays; a ``.array`` rebound to
        another dtype) into their place."""
        layout, place = self._layouts[number], self._places[number]
        for param, view, lo, hi in zip(layout.params, self._views[number], layout.offsets,
                                       layout.offsets[1:]):
            if param.array is not view:
                copy_into_host(place[lo:hi], param.array)


def _starts(layouts: Sequence[BackToBack]) -> List[int]:
    starts, at = [], 0
    for layout in layouts:
        starts.append(at)
        at += round_up(layout.numel * np.dtype(layout.dtype).itemsize, ALIGN_BYTES)
    return starts


__all__ = ["SharedUpdates"]
