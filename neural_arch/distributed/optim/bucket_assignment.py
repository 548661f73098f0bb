"""Which rank updates which of DDP's buckets when ``ZeroRedundancyOptimizer`` overlaps DDP
(``overlap_with_ddp=True``): PyTorch's rule, so that a run splits the work as torch's does.

A rank can update a bucket's parameters as soon as that bucket's average is in, while later
buckets still travel; so the parameters are dealt out by bucket, not one by one as
``sharding.partition_parameters`` deals them. With ``shard_buckets=False`` bucket ``i`` goes
whole to rank ``i % world_size`` (a world larger than the number of buckets leaves ranks
with nothing to update). With ``shard_buckets=True`` the buckets, smallest first, are cut into
runs of consecutive parameters below the threshold ``total elements / world_size``, each run
to the rank with the fewest elements so far that holds no other run of that bucket: more even
shares, at the price of several owners (several broadcasts) for a large bucket.

An ``Assignment`` is one such run; each rank's share of each parameter group follows
from the assignments (``partition_by_assignment``), in the layout ``sharding.Partition`` that
the optimizer's checkpoints read.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Sequence, Set

from .sharding import Partition


@dataclass
class Assignment:
    """Parameters ``offset`` .. ``offset + len(params)`` of DDP bucket ``bucket``, updated by
    group rank ``rank`` and broadcast from it."""

    bucket: int
    offset: int
    params: List[Any]
    rank: int


def assign_buckets(params_per_bucket: Sequence[Sequence[Any]], world_size: int,
                   shard_buckets: bool) -> List[Assignment]:
    """The assignments of every bucket, ordered by bucket and offset (the order in which every
    rank broadcasts them). Empty buckets (DDP makes none) are skipped."""
    if not shard_buckets:
        return [Assignment(i, 0, list(params), i % world_size)
                for i, params in enumerate(params_per_bucket) if params]
    sizes = [sum(p.array.size for p in params) for params in params_per_bucket]
    threshold = sum(sizes) / world_size
    load = [0] * world_size
    assignments: List[Assignment] = []
    for bucket in sorted(range(len(sizes)), key=lambda i: sizes[i]):  # stable: ties by index
        params = list(params_per_bucket[bucket])
        taken: Set[int] = set()

        def deal(start: int, stop: int, elements: int) -> None:
            rank = _least_loaded(load, taken)
            assignments.append(Assignment(bucket, start, params[start:stop], rank))
            taken.add(rank)
            load[rank] += elements

        start, run = 0, 0
        for index, param in enumerate(params):
            if run + param.array.size >= threshold and index > start:
                deal(start, index, run)
                start, run = index, 0
            run += param.array.size
        if params:
            deal(start, len(params), run)
    return sorted(assignments, key=lambda a: (a.bucket, a.offset))


def _least_loaded(load: Sequence[int], excluded: Set[int]) -> int:
    """The rank with the smallest load outside ``excluded`` (ties: the lowest rank). A bucket
    of small and large parameters in turn can be cut into more runs than there are ranks;
    once every rank holds one of its runs, the least loaded of all takes the next (torch
    stops there with an assertion)."""
    candidates = [r for r in range(len(load)) if r not in excluded] or range(len(load))
    return min(candidates, key=lambda r: (load[r], r))


def partition_by_assignment(param_groups: Sequence[Dict[str, Any]],
                            assignments: Sequence[Assignment], world_size: int) -> Partition:
    """Rank -> parameter group -> the parameters that rank updates, in assignment order."""
    group_of = {id(p): g for g, group in enumerate(param_groups) for p in group["params"]}
    partition: Partition = [[[] for _ in param_groups] for _ in range(world_size)]
    for assignment in assignments:
        for param in assignment.params:
            partition[assignment.rank][group_of[id(param)]].append(param)
    return partition


__all__ = ["Assignment", "assign_buckets", "partition_by_assignment"]
