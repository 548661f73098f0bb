"""How the MPI transport's waits poll, on a fake clock and fake requests (no MPI needed).

Open MPI moves a message only while some call of the process drives it, so a wait that sleeps
between polls stalls the transfer, and one sleep costs tens of microseconds however short it is
asked to be (the kernel's timer slack): several times a whole small message. A wait that ends
within the spin window must never sleep; a long wait must sleep (not burn a shared core), in
naps bounded so that it still wakes up soon after its message arrives.
"""
from types import SimpleNamespace

import pytest

from neural_arch.distributed.errors import CollectiveTimeoutError
from neural_arch.distributed.transports import mpi_waiting
from neural_arch.distributed.transports.base import Fingerprint

pytestmark = pytest.mark.timeout(30)
TICK_S = 1e-6  # the fake clock advances this much per reading: about one poll's cost


class _Clock:
    def __init__(self):
        self.now, self.naps, self.yields = 0.0, [], 0

    def monotonic(self):
        self.now += TICK_S
        return self.now

    def sleep(self, seconds):
        self.naps.append(seconds)
        self.now += seconds

    def sched_yield(self):
        self.yields += 1


class _Request:
    """Completes after ``polls`` tests."""

    def __init__(self, polls):
        self.left = polls

    def Cancel(self):
        pass


def _testall(reqs):
    for req in reqs:
        req.left -= 1
    return all(req.left <= 0 for req in reqs)


class _Waiter(mpi_waiting.RequestWaiting):
    rank, world_size = 0, 2

    def __init__(self, timeout):
        self.timeout = timeout
        self._mpi = SimpleNamespace(Request=SimpleNamespace(Testall=_testall),
                                    Exception=RuntimeError)
        self._next_check = float("inf")  # no liveness looks: no peers here
        self._unusable = {}


@pytest.fixture
def clock(monkeypatch):
    fake = _Clock()
    monkeypatch.setattr(mpi_waiting, "time", fake)
    monkeypatch.setattr(mpi_waiting, "os", fake, raising=False)
    return fake


FP = Fingerprint("all_reduce", 3, "float32", 1)


def test_a_wait_shorter_than_the_spin_window_never_sleeps(clock):
    polls = 1000  # about 1 ms on the fake clock
    _Waiter(60.0)._wait([_Request(polls)], [1], FP)
    assert clock.naps == [], f"slept {len(clock.naps)} times in a {polls}-poll wait"
    assert clock.yields > polls // 2, "a spinning wait must let other processes have the core"


def test_a_wait_shorter_than_a_large_piece_keeps_the_core(clock):
    polls = int(0.75 * mpi_waiting.YIELD_AFTER_S / TICK_S)  # a 1 MiB piece moves meanwhile
    _Waiter(60.0)._wait([_Request(polls)], [1], FP)
    assert (clock.naps, clock.yields) == ([], 0)


def test_a_long_wait_sleeps_in_short_naps_and_still_times_out(clock):
    waiter = _Waiter(0.5)
    with pytest.raises(CollectiveTimeoutError, match=r"all_reduce #3 .* within 0.5 s") as info:
        waiter._wait([_Request(10 ** 9)], [1], FP)
    assert info.value.peer == 1 and waiter._unusable[1].startswith("timeout")
    assert clock.naps, "a half-second wait never slept: it burned a core throughout"
    assert max(clock.naps) <= 1e-3, f"a nap of {max(clock.naps)} s delays the wake-up"
    assert sum(clock.naps) > 0.4  # most of a long wait is spent asleep
