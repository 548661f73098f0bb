"""The futex wrapper and the sleep/wake protocol of shm_sync, across real processes.

A child sleeps on a word of a shared mapping with a long timeout; the parent changes the word
and wakes it. The child reports how long it slept: far less than its timeout means the wake-up
reached it (a broken wake would leave it asleep for the whole timeout)."""
from __future__ import annotations

import mmap
import multiprocessing as mp
import time

import numpy as np
import pytest

from neural_arch.distributed.transports.shm import futex
from neural_arch.distributed.transports.shm import waiting as shm_sync
from neural_arch.distributed.transports.shm.waiting import (PeerWatch, sleep_until_ge,
                                                         wake_sleepers)

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not futex.AVAILABLE, reason="no futex on this platform")]
LONG_S = 60.0
COUNTER, FLAG = 0, 8  # words of the shared page: a counter and the sleeper's flag


def _address(mm: mmap.mmap, word: int) -> int:
    return np.frombuffer(mm, np.int64).ctypes.data + 8 * word


def _raw_sleeper(mm, started, result) -> None:
    words = memoryview(mm).cast("q")
    started.set()
    begin = time.monotonic()
    while words[COUNTER] == 0:
        futex.wait(_address(mm, COUNTER), 0, LONG_S)
    result.put(time.monotonic() - begin)


def _protocol_sleeper(mm, started, result) -> None:
    words = memoryview(mm).cast("q")
    watch = PeerWatch(1, [0, 0], lambda peer: False)
    watch.spin_polls = 16  # give up spinning at once: the test is about the sleep
    # One long sleep, not short slices between checks: only the writer's wake can end it.
    shm_sync.FUTEX_SLICE_S = shm_sync.LIVENESS_PERIOD_S = LONG_S
    started.set()
    begin = time.monotonic()
    sleep_until_ge(words, COUNTER, 5, 0, watch, LONG_S, "test", 1, "the counter", FLAG,
                   _address(mm, 0))
    result.put((time.monotonic() - begin, words[FLAG]))


def _run(target, wake) -> object:
    ctx = mp.get_context("fork")
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    started, result = ctx.Event(), ctx.Queue()
    child = ctx.Process(target=target, args=(mm, started, result), daemon=True)
    child.start()
    try:
        assert started.wait(30)
        time.sleep(0.5)  # let the child fall asleep in the kernel
        wake(memoryview(mm).cast("q"), _address(mm, COUNTER))
        return result.get(timeout=30)
    finally:
        child.join(10)
        if child.is_alive():
            child.kill()


def test_wait_returns_at_once_when_the_word_differs():
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    memoryview(mm).cast("q")[COUNTER] = 3
    begin = time.monotonic()
    futex.wait(_address(mm, COUNTER), 2, LONG_S)  # the kernel sees 3, not 2: no sleep
    assert time.monotonic() - begin < LONG_S / 2


def test_wait_ends_at_its_timeout_without_a_wake():
    mm = mmap.mmap(-1, mmap.PAGESIZE)
    begin = time.monotonic()
    futex.wait(_address(mm, COUNTER), 0, 0.2)
    assert time.monotonic() - begin >= 0.15


def test_wake_reaches_a_process_asleep_on_shared_memory():
    def wake(words, address):
        words[COUNTER] = 1
        futex.wake(address)
    slept = _run(_raw_sleeper, wake)
    assert 0.3 < slept < LONG_S / 2, slept


def test_a_writer_wakes_a_sleeper_that_flagged_its_word_and_the_flag_is_cleared():
    def wake(words, address):
        assert words[FLAG] == COUNTER + 1  # the sleeper says which word it sleeps on
        words[COUNTER] = 5
        wake_sleepers(words, COUNTER, [FLAG], address - 8 * COUNTER)
    slept, flag_after = _run(_protocol_sleeper, wake)
    assert 0.3 < slept < LONG_S / 2, slept
    assert flag_after == 0


def test_a_writer_wakes_only_ranks_asleep_on_its_word(monkeypatch):
    calls = []
    monkeypatch.setattr(futex, "wake", calls.append)
    words = memoryview(bytearray(128)).cast("q")
    words[FLAG] = 3 + 1  # asleep on word 3
    wake_sleepers(words, 2, [FLAG], 1000)
    assert calls == []
    wake_sleepers(words, 3, [FLAG], 1000)
    assert calls == [1000 + 8 * 3]  # the address of word 3 of counters starting at 1000


def test_a_peer_that_arrived_and_then_closed_is_not_failed():
    """A peer may store the counter a rank waits for and close its transport at once (after
    raising a mismatch it saw there): the waiter that looks at the peer's liveness before it
    reads the counter again must not fail the wait for it, and must when the counter did not
    get there."""
    from neural_arch.distributed.errors import PeerFailureError
    words = np.zeros(2, np.int64)
    watch = PeerWatch(1, [0, 0], lambda peer: True)  # peer 0 has closed its end
    target = [5]
    backoff = shm_sync.Backoff(watch, 10.0, "test", 1, "the counter",
                               lambda: words[COUNTER] >= target[0])
    backoff.start -= 1.0  # waited long enough that a closed peer fails the look
    words[COUNTER] = 5  # stored before it closed
    backoff.check((0,))
    target[0] = 6
    watch.next_check = 0.0  # look again at once
    with pytest.raises(PeerFailureError, match="peer rank 0 closed"):
        backoff.check((0,))
