"""The rows of one message size in ``bench_collectives.py``, timed in turns.

A row is one way of making the call at that size (ours, MPI's own, the AVERAGE all-reduce, the
plain loop, the fresh-data forms, the shm references), with buffers of its own, checked against
NumPy before and after its timed calls (``TimedRow``). Up to ``TURNS_MAX_BYTES`` a size's rows
are timed batch by batch in turns (``in_turns``), so that the ratio of two rows compares calls
rather than two moments of a machine whose speed drifts; above, one row after another
(``TimedRow.alone``), so that one row's buffers are held at a time.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import bench_common as common
import collective_calls as rank_calls
import fresh_calls
from collective_calls import time_plain_loop
from collectives_report import AVERAGE, FRESH, LOOP, LOOP_TURN_CALLS, REFERENCES


class TimedRow:
    """One row of a point: its buffers and call, checked against NumPy before the timed calls
    (``check_after``: and after them)."""

    def __init__(self, collective: str, label: str, make: Callable, barrier: Optional[Callable],
                 count: int, rank: int, p: int) -> None:
        self.collective, self.label, self.barrier, self.rank, self.p = \
            collective, label, barrier, rank, p
        self.buffers = rank_calls.buffers(collective, count, p)
        self.call = make(collective, self.buffers)
        self.checked, self.average = label not in REFERENCES, label == AVERAGE
        self.rewritten = label.endswith(FRESH)
        if self.rewritten:  # the outputs follow from the inputs rewritten for each call
            fresh_calls.check_rewritten(collective, self.buffers, rank, p, self.call)
        elif self.checked:
            rank_calls.check(collective, self.buffers, self.call, rank, p, self.average)

    def batch(self, calls: int) -> List[float]:
        """Seconds per call of one batch of ``calls`` right after the row's barrier (one round
        of ``in_turns``). The plain loop's batch: at least LOOP_TURN_CALLS calls after a
        barrier, each timed on its own with none between them (its warm-up is the untimed
        first round), so that most of its calls start where the last one left the ranks, as in
        a user's loop, also where a batch of the others holds one call."""
        if self.label == LOOP:
            from neural_arch import distributed as dist
            dist.barrier()
            return time_plain_loop(self.call, max(calls, LOOP_TURN_CALLS), warmup=0)
        return common.time_batches(self.call, self.barrier, calls, 1, warmup_batches=0)

    def alone(self, calls: int, batches: int) -> List[float]:
        """Seconds per call of ``batches`` batches of ``calls`` after an untimed one, each right
        after the row's barrier; the plain loop's ``calls x batches`` calls, each timed on its
        own, in one loop after a barrier."""
        if self.label == LOOP:
            from neural_arch import distributed as dist
            dist.barrier()
            return time_plain_loop(self.call, calls * batches)
        return common.time_batches(self.call, self.barrier, calls, batches)

    def check_after(self) -> None:
        if self.rewritten:  # as the last timed call left them
            fresh_calls.check_rewritten(self.collective, self.buffers, self.rank, self.p)
        elif self.checked:  # still right after the timed calls
            rank_calls.check(self.collective, self.buffers, self.call, self.rank, self.p,
                             self.average)


def in_turns(timed: Sequence[TimedRow], calls: int, batches: int) -> List[List[float]]:
    """Each row's seconds per call, its batches timed in turns with the other rows': one
    untimed batch each, then ``batches`` rounds of one batch each, each round's order
    shuffled the same way on every rank. Timing one row's batches after another's compares
    moments of a drifting machine rather than the calls: with another job busy on both cores
    of the 2-core machine (shm, p = 2, all-reduce at 4 B - 4 MiB, four runs of each form in
    turns), AVERAGE read within 7 % of SUM at 17 of 24 sizes and runs timed in turns, at 13 of
    24 timed one after the other (a busy machine: outliers either way in both forms)."""
    import random
    times: List[List[float]] = [[] for _ in timed]
    order = list(range(len(timed)))
    for round_index in range(batches + 1):
        random.Random(round_index).shuffle(order)
        for i in order:
            got = timed[i].batch(calls)
            if round_index:
                times[i] += got
    return times
