"""PreemptionHandler: signals become a flag, previous handlers come back, and should_stop()
makes every rank stop after the same step."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from dist_harness import run_ranks
from neural_arch.distributed.health.preemption import PreemptionHandler, any_rank_requested

pytestmark = pytest.mark.timeout(60)


def test_signals_set_the_flag_instead_of_stopping():
    with PreemptionHandler() as preemption:
        assert not preemption.requested and preemption.received_signal is None
        os.kill(os.getpid(), signal.SIGTERM)
        assert preemption.requested and preemption.received_signal == signal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt either
        assert preemption.received_signal == signal.SIGINT
        assert preemption.should_stop()  # no process group: the local flag


def test_previous_handlers_are_restored_even_after_an_error():
    seen = []
    previous_term = signal.signal(signal.SIGTERM, lambda signum, frame: seen.append(signum))
    previous_usr1 = signal.getsignal(signal.SIGUSR1)
    try:
        term_handler = signal.getsignal(signal.SIGTERM)
        with pytest.raises(ZeroDivisionError):
            with PreemptionHandler(signals=(signal.SIGTERM, signal.SIGUSR1)):
                assert signal.getsignal(signal.SIGTERM) is not term_handler
                os.kill(os.getpid(), signal.SIGUSR1)
                1 / 0
        assert signal.getsignal(signal.SIGTERM) is term_handler
        assert signal.getsignal(signal.SIGUSR1) == previous_usr1
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, previous_term)


def test_misuse_is_reported():
    preemption = PreemptionHandler()
    with preemption:
        with pytest.raises(RuntimeError, match="already installed"):
            preemption.__enter__()
    with pytest.raises(ValueError, match="at least one signal"):
        PreemptionHandler(signals=())
    errors = []

    def enter_from_thread():
        try:
            with PreemptionHandler():
                pass
        except RuntimeError as exc:
            errors.append(str(exc))

    thread = threading.Thread(target=enter_from_thread, name="worker-thread")
    thread.start()
    thread.join(10)
    assert errors and "main thread" in errors[0] and "worker-thread" in errors[0]


def test_request_from_code_and_no_group():
    preemption = PreemptionHandler()
    assert not preemption.should_stop()
    preemption.request()
    assert preemption.requested and preemption.should_stop()
    assert any_rank_requested(True) and not any_rank_requested(False)


def _loop_until_stop(rank, world_size, signal_rank, signal_step, steps):
    with PreemptionHandler() as preemption:
        for step in range(steps):
            if rank == signal_rank and step == signal_step:
                os.kill(os.getpid(), signal.SIGTERM)
            if preemption.should_stop():
                return step, preemption.requested
    return None, preemption.requested


@pytest.mark.parametrize("signal_rank", [0, 2])
def test_one_signalled_rank_stops_every_rank_at_the_same_step(signal_rank):
    outcomes = run_ranks(_loop_until_stop, 3, "shm", args=(signal_rank, 4, 10))
    assert [step for step, _ in outcomes] == [4, 4, 4]
    assert [requested for _, requested in outcomes] == [r == signal_rank for r in range(3)]


def test_no_signal_no_stop():
    assert run_ranks(_loop_until_stop, 2, "shm", args=(-1, -1, 6)) == [(None, False)] * 2
