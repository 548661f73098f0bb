"""Work handles and the issue-ordered queue behind ``async_op=True``."""
from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from neural_arch.distributed.errors import CollectiveTimeoutError, DistributedError
from neural_arch.distributed.work import CommQueue, Work, to_seconds

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def queue():
    q = CommQueue(rank=0, timeout=5.0)
    yield q
    q.close(5.0)


def test_async_work_runs_in_issue_order_on_one_thread(queue):
    order, threads = [], set()

    def job(i):
        def run():
            time.sleep(0.01 * (5 - i))  # later jobs are quicker: only the queue keeps order
            order.append(i)
            threads.add(threading.get_ident())
            return i * i
        return run

    works = [queue.submit(job(i), "op", i) for i in range(5)]
    assert [w.result() for w in works] == [0, 1, 4, 9, 16]
    assert order == [0, 1, 2, 3, 4]
    assert len(threads) == 1 and threading.get_ident() not in threads


def test_synchronous_call_waits_for_pending_async_work(queue):
    events = []
    release = threading.Event()

    def slow():
        release.wait(5)
        events.append("async")

    work = queue.submit(slow, "slow", 1)
    threading.Timer(0.1, release.set).start()
    queue.run_sync(lambda: events.append("sync"), "sync", 2)
    assert events == ["async", "sync"]
    assert work.is_completed() and work.is_success()


def test_errors_are_kept_and_re_raised_by_wait(queue):
    def boom():
        raise ValueError("bad buffer 7")

    work = queue.submit(boom, "op", 3)
    with pytest.raises(ValueError, match="bad buffer 7"):
        work.wait()
    assert work.is_completed() and not work.is_success()
    assert isinstance(work.exception(), ValueError)
    # the queue keeps serving after a failure
    assert queue.submit(lambda: 5, "op", 4).result() == 5


def test_wait_timeout_raises_naming_the_operation(queue):
    gate = threading.Event()
    work = queue.submit(lambda: gate.wait(5), "all_reduce:sum", 9)
    with pytest.raises(CollectiveTimeoutError, match=r"all_reduce:sum #9"):
        work.wait(timeout=0.05)
    assert not work.is_completed()
    gate.set()
    assert work.wait(timedelta(seconds=5)) is True


def test_closed_queue_refuses_new_work():
    q = CommQueue(rank=2, timeout=1.0)
    assert q.submit(lambda: 1, "op", 1).result() == 1
    q.close(2.0)
    with pytest.raises(DistributedError, match="destroyed"):
        q.submit(lambda: 2, "op", 2)


def test_completed_work_is_done_at_once():
    work = Work.completed("barrier", [1, 2], rank=0)
    assert work.is_completed() and work.wait() and work.result() == [1, 2]


@pytest.mark.parametrize("bad", [0, -1, "3", None, True])
def test_timeouts_must_be_positive_seconds(bad):
    with pytest.raises(ValueError, match=repr(bad).strip("'") if bad is not None else "None"):
        to_seconds(bad)
    assert to_seconds(timedelta(milliseconds=1500)) == 1.5
