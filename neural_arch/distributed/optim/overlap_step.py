"""The optimizer step of ``ZeroRedundancyOptimizer(overlap_with_ddp=True)``, run bucket by
bucket from inside DDP's communication hook (``comm_hooks.ddp_zero_hook``).

DDP calls the hook once per bucket, in bucket order on every rank, as backward produces the
bucket's last gradient; the hook starts the bucket's average (the user's hook) and hands the
bucket and its future to ``OverlapStep.record``. ``step_through(k)`` then takes buckets in
order up to ``k``: waits for the bucket's average, lets the owner of each of its assignments
(``bucket_assignment``) update those parameters with the local optimizer, the averaged
bucket serving as their gradients, and queues an asynchronous broadcast of the updated values
from the owner. So the step and the broadcasts run while later buckets are still averaged (and,
interleaved, while backward still computes). After the last bucket every rank waits for the
broadcasts and copies the values it received into its parameters: when backward returns,
every replica holds the updated parameters and ``step()`` has nothing left to do.

Every rank waits for every bucket's future in bucket order (not only for the buckets it
owns): a hook whose future runs collectives of its own when waited for (PowerSGD's second
all-reduce) then issues them in the same order everywhere. The broadcasts go to the
communication queue in assignment order, the same on every rank. Each assignment's values
travel in a buffer of its own, kept from step to step (``back_to_back``).

On DDP's shared buckets (the plain average, on the whole world of an ``shm`` transport) no
hook runs: DDP averages the buckets in shared memory and unpacks them, then calls
``step_on_shared``: every owner updates its parameters from their averaged gradients, in a
shared segment where its parameters live (``shared_updates``), and the others copy the new
values out of it, with no broadcast at all. Each owner publishes a count of the updates it
has made (``SharedBucketArena.publish_written``), which the readers wait for, update by
update, in assignment order, and a barrier at the end keeps every owner from returning (and
its user from changing the parameters in place) before every peer has read them. Where that
segment cannot be had, the owner writes its updates
over its own copy of the bucket instead, once every peer has read its slices of the averaged
gradients (``SharedBucketArena.meet``).
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from .. import collectives
from ..group.world import resolve_group
from .back_to_back import BackToBack
from .bucket_assignment import Assignment
from .shared_updates import SharedUpdates

# ``step_params(params, grads)``: the local optimizer's update of ``params`` (this rank owns
# them) with ``grads``, arrays shaped like the parameters (None: no gradient)
StepParams = Callable[[Sequence[Any], Sequence[Any]], None]


class OverlapStep:
    """One backward's bucket-by-bucket step (see the module docstring). ``params_per_bucket``
    is DDP's layout, ``ranks`` the group's global ranks (broadcast roots are global ranks)."""

    def __init__(self, assignments: Sequence[Assignment],
                 params_per_bucket: Sequence[Sequence[Any]], rank: int,
                 ranks: Sequence[int], group: Any, step_params: StepParams,
                 on_finished: Callable[[], None]) -> None:
        self.assignments = list(assignments)
        self.params_per_bucket = [list(params) for params in params_per_bucket]
        self.rank, self.ranks, self.group = rank, tuple(ranks), group
        self._step_params, self._on_finished = step_params, on_finished
        self._numbers_of: Dict[int, List[int]] = {}  # bucket -> its assignments' numbers
        for number, assignment in enumerate(self.assignments):
            self._numbers_of.setdefault(assignment.bucket, []).append(number)
        self.num_buckets = len(self.params_per_bucket)
        self._layouts = [BackToBack(a.params) for a in self.assignments]
        self._flats: List[Any] = [None] * len(self.assignments)  # made at the first send
        # where each assignment lies in its DDP bucket (elements)
        self._spans = []
        for a, layout in zip(self.assignments, self._layouts):
            start = sum(p.array.size for p in self.params_per_bucket[a.bucket][:a.offset])
            self._spans.append((start, start + layout.numel))
        self._checked_shared = None  # the shared buckets whose layout was checked
        self._updates = None  # SharedUpdates; False: shared memory would not have them
        self._reset()

    def _reset(self) -> None:
        self._expected = 0  # the bucket index the hook should see next
        self._stepped = 0   # buckets stepped and broadcast this backward
        self._waiting: Dict[int, Tuple[Any, Any]] = {}  # index -> (GradBucket, future)
        self._sent: List[Tuple[int, Any]] = []  # (assignment number, broadcast work)

    @property
    def recorded(self) -> int:
        """Buckets the hook has seen in this backward."""
        return self._expected

    def record(self, bucket: Any, future: Any) -> None:
        """The hook saw ``bucket`` (a ``GradBucket``), whose average ``future`` will give."""
        index = bucket.index()
        if index == 0:
            self._reset()  # a new backward (also drops what one that failed halfway left)
        if index != self._expected or index >= self.num_buckets:
            raise RuntimeError(
                f"ZeroRedundancyOptimizer(overlap_with_ddp=True): DDP's hook got bucket {index} "
                f"where bucket {self._expected} of {self.num_buckets} was due; build the hook "
                "with the DistributedDataParallel it is registered on")
        expected = self.params_per_bucket[index]
        got = bucket.parameters()
        if len(got) != len(expected) or any(a is not b for a, b in zip(got, expected)):
            raise RuntimeError(
                f"ZeroRedundancyOptimizer(overlap_with_ddp=True): bucket {index} holds "
                f"{len(got)} parameters of shapes {[tuple(p.array.shape) for p in got]}, not "
                f"the {len(expected)} of the DistributedDataParallel the hook was built with "
                f"({[tuple(p.array.shape) for p in expected]}); register the hook on that one")
        self._waiting[index] = (bucket, future)
        self._expected += 1

    def step_through(self, last: int) -> None:
        """Step and broadcast every bucket not yet stepped up to index ``last``; after the
        last bucket, wait for the broadcasts and take in the received parameters."""
        while self._stepped <= last:
            self._step_bucket(self._stepped)
            self._stepped += 1
        if self._stepped == self.num_buckets:
            self._finish()

    def _step_bucket(self, index: int) -> None:
        bucket, future = self._waiting.pop(index)
        gradients = _averaged_gradients(bucket, future)
        for number in self._numbers_of.get(index, ()):
            assignment, layout = self.assignments[number], self._layouts[number]
            flat = self._flats[number]
            if flat is None:  # its first send; later steps reuse it (their broadcasts wait)
                flat = self._flats[number] = layout.empty()
            if assignment.rank == self.rank:
                first = assignment.offset
                self._step_params(assignment.params,
                                  gradients[first:first + len(assignment.params)])
                layout.pack_values(flat)
            work = collectives.broadcast(flat, src=self.ranks[assignment.rank],
                                         group=self.group, async_op=True)
            self._sent.append((number, work))

    def _finish(self) -> None:
        sent, self._sent = self._sent, []
        for number, work in sent:
            work.wait()
            if self.assignments[number].rank != self.rank:
                self._layouts[number].unpack_values(self._flats[number])
        self._reset()
        self._on_finished()

    # ----- on DDP's shared buckets ----------------------------------------------------------
    def step_on_shared(self, arena: Any, params_per_bucket: Sequence[Sequence[Any]]) -> None:
        """After DDP averaged its shared buckets and unpacked them into the gradients (before
        it releases the segment): the owners update their parameters, which live in shared
        memory (``shared_updates``), and every other rank copies them out (see the module
        docstring)."""
        self._check_shared_layout(arena, params_per_bucket)
        if self._updates is None:  # the first such step: the same point on every rank
            self._updates = SharedUpdates.open(resolve_group(self.group), self.assignments,
                                               self._layouts, self.rank) or False
        updates = self._updates or None
        if updates is None:  # the updates go through this rank's copies of the buckets,
            # where the peers may still read its slices of the averaged gradients
            arena.meet("every rank to unpack the averaged gradients")
        # this rank's own updates first, each published as soon as it is written, so that
        # the peers read it while this rank goes on with the next
        for number, assignment in enumerate(self.assignments):
            if assignment.rank == self.rank:
                params = assignment.params
                if updates is not None:
                    updates.before_update(number)
                # a parameter no rank used has no gradient here (DDP drops it); under a
                # hook its bucket's zeros are stepped: the same here, on every transport
                self._step_params(params, [_zeros_like(p) if p.grad is None else p.grad.array
                                           for p in params])
                if updates is not None:
                    updates.after_update(number)
                else:
                    self._layouts[number].pack_values(self._in_bucket(arena, number))
                self._written[self.rank] += 1
                arena.publish_written(self._written[self.rank])
        for number, assignment in enumerate(self.assignments):
            owner = assignment.rank
            if owner != self.rank:
                self._written[owner] += 1
                arena.wait_written(owner, self._written[owner],
                                   f"rank {owner} to write its update of bucket "
                                   f"{assignment.bucket}")
                self._layouts[number].unpack_values(
                    self._in_bucket(arena, number) if updates is None
                    else updates.place(number))
        # an owner's parameters are what the peers read: none may change them in place (a
        # user's code after backward, say) before every peer has its copy
        arena.meet("every rank to read the updated parameters")
        self._reset()
        self._on_finished()

    def _in_bucket(self, arena: Any, number: int) -> np.ndarray:
        """Where assignment ``number`` lies in its owner's copy of its DDP bucket."""
        assignment, (lo, hi) = self.assignments[number], self._spans[number]
        return arena.copy_of(assignment.rank, assignment.bucket)[lo:hi]

    def _check_shared_layout(self, arena: Any, params_per_bucket: Sequence[Sequence[Any]]):
        if self._checked_shared is arena:
            return
        theirs = [[id(p) for p in params] for params in params_per_bucket]
        if theirs != [[id(p) for p in params] for params in self.params_per_bucket]:
            raise RuntimeError(
                f"ZeroRedundancyOptimizer(overlap_with_ddp=True): the DistributedDataParallel "
                f"this hook is registered on has buckets of {[len(b) for b in theirs]} "
                f"parameters, not those of the one the hook was built with "
                f"({[len(b) for b in self.params_per_bucket]}, or other parameters); register "
                "the hook on that one")
        self._checked_shared = arena
        self._written = [0] * len(self.ranks)  # pieces each rank wrote into this segment


def _zeros_like(param: Any) -> np.ndarray:
    return np.zeros(param.array.shape, dtype=param.array.dtype)


def _averaged_gradients(bucket: Any, future: Any) -> List[np.ndarray]:
    """The bucket's averaged gradients, one host view per parameter. A hook whose future gives
    another array than the bucket's buffer has it copied in here, as DDP does afterwards."""
    result = future.wait()
    flat = bucket.buffer()
    if result is not flat:
        result = np.asarray(result)
        if result.size != flat.size:
            raise ValueError(f"the communication hook returned {result.size} values for bucket "
                             f"{bucket.index()}, which holds {flat.size} gradients")
        np.copyto(flat, result.reshape(-1), casting="same_kind")
    return bucket.gradients()


__all__ = ["OverlapStep"]
