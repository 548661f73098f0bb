"""How ``BatchingWorker``'s thread waits for a batch: until the deadline of the oldest request
(its batch's first), in one wait rather than short polls, and never while a batch is ready, even
when a request arrives just as the thread finds the queue empty. The batcher's condition is
replaced by one that records every wait of the batching thread, so these tests look at the
waits' timeouts and what was queued then, not at wall time."""
from __future__ import annotations

import threading
from concurrent.futures import Future

import numpy as np
import pytest

from neural_arch.tabgpt.serving import BatchingWorker, DynamicBatcher

pytestmark = pytest.mark.timeout(20)

BATCHING_THREAD = "dynamic-batcher"


class RecordingCondition(threading.Condition):
    """The batcher's condition; records (timeout, pending rows, seconds until ready) at each
    wait of the batching thread, and can add ``inject`` (rows, ticket) to the batcher from that
    thread just after it lets go of the lock with nothing pending."""

    def __init__(self, batcher: DynamicBatcher) -> None:
        super().__init__()  # an RLock: the records below read the batcher while it is held
        self.batcher, self.waits, self.inject = batcher, [], None
        self._reading = False
        batcher.changed = self

    def _in_batching_thread(self) -> bool:
        return threading.current_thread().name == BATCHING_THREAD and not self._reading

    def _read(self, what):
        self._reading = True
        try:
            return what()
        finally:
            self._reading = False

    def wait(self, timeout=None):
        if self._in_batching_thread():
            self.waits.append((timeout, self._read(self.batcher.pending_rows),
                               self._read(self.batcher.seconds_until_ready)))
        return super().wait(timeout)

    def __exit__(self, *exc):
        idle = self.inject is not None and self._in_batching_thread() and \
            self._read(self.batcher.pending_rows) == 0
        result = super().__exit__(*exc)
        if idle:
            (rows, ticket), self.inject = self.inject, None
            self.batcher.add_request(rows, ticket=ticket)
        return result


def test_the_thread_sleeps_until_the_oldest_requests_deadline_in_one_wait():
    batcher = DynamicBatcher(max_batch_size=8, timeout_ms=250, padding_strategy="longest")
    condition = RecordingCondition(batcher)
    with BatchingWorker(lambda batch: batch.data[:, 0], batcher) as worker:
        first = worker.submit(np.array([[1.0]]))
        second = worker.submit(np.array([[2.0]]))
        assert first.result(timeout=10).tolist() == [1.0]
        assert second.result(timeout=10).tolist() == [2.0]
        assert worker.batches_run == 1  # one batch, closed by the first request's deadline
    waiting = [(timeout, left) for timeout, rows, left in condition.waits if rows]
    assert waiting, condition.waits
    for timeout, left in waiting:
        # the wait lasts until the oldest request's deadline: not a short poll, not longer
        assert timeout is not None and left - 0.02 <= timeout <= left + 0.02, condition.waits
    assert len(waiting) <= 3, condition.waits  # woken by its deadline, not by steps


def test_a_request_that_arrives_as_the_thread_finds_the_queue_empty_is_not_missed():
    batcher = DynamicBatcher(max_batch_size=8, timeout_ms=0, padding_strategy="longest")
    condition = RecordingCondition(batcher)
    late = Future()
    condition.inject = (np.array([[5.0]]), late)
    with BatchingWorker(lambda batch: batch.data[:, 0] * 10, batcher) as worker:
        assert worker.predict(np.array([[1.0]]), timeout=10).tolist() == [10.0]
        assert late.result(timeout=10).tolist() == [50.0]
    assert condition.inject is None  # the request was added at that moment
    ready = [(timeout, rows) for timeout, rows, left in condition.waits if rows and left == 0]
    assert not ready, f"the batching thread waited with a batch ready: {condition.waits}"
