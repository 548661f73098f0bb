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
communication queue in assignment order, the same on every rank.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence, Tuple

import numpy as np

from .. import collectives
from ..buffers import copy_from_host, copy_into_host
from .bucket_assignment import Assignment

# ``step_params(params, grads)``: the local optimizer's update of ``params`` (this rank owns
# them) with ``grads``, host arrays shaped like the parameters
StepParams = Callable[[Sequence[Any], Sequence[np.ndarray]], None]


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
        self.by_bucket: Dict[int, List[Assignment]] = {}
        for assignment in self.assignments:
            self.by_bucket.setdefault(assignment.bucket, []).append(assignment)
        self.num_buckets = len(self.params_per_bucket)
        self._reset()

    def _reset(self) -> None:
        self._expected = 0  # the bucket index the hook should see next
        self._stepped = 0   # buckets stepped and broadcast this backward
        self._waiting: Dict[int, Tuple[Any, Any]] = {}  # index -> (GradBucket, future)
        self._sent: List[Tuple[Assignment, np.ndarray, Any]] = []  # (assignment, flat, work)

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
        for assignment in self.by_bucket.get(index, ()):
            params = assignment.params
            if assignment.rank == self.rank:
                self._step_params(params, gradients[assignment.offset:
                                                    assignment.offset + len(params)])
            flat = _flat_for(params)
            if assignment.rank == self.rank:
                start = 0
                for param in params:
                    copy_into_host(flat[start:start + param.array.size], param.array)
                    start += param.array.size
            work = collectives.broadcast(flat, src=self.ranks[assignment.rank],
                                         group=self.group, async_op=True)
            self._sent.append((assignment, flat, work))

    def _finish(self) -> None:
        sent, self._sent = self._sent, []
        for assignment, flat, work in sent:
            work.wait()
            if assignment.rank == self.rank:
                continue
            start = 0
            for param in assignment.params:
                stop = start + param.array.size
                values = flat[start:stop].reshape(param.array.shape)
                copy_from_host(values, param.array, out=param.array)
                param.mark_modified_in_place()  # the owner's update, written in place
                start = stop
        self._reset()
        self._on_finished()


def _flat_for(params: Sequence[Any]) -> np.ndarray:
    """A host buffer for the values of ``params`` back to back (one dtype: one DDP bucket)."""
    return np.empty(sum(p.array.size for p in params), dtype=params[0].array.dtype)


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
