"""What the records say of gradient communication: ``comm_ms()`` the time a step waited for
it (with overlap, the wait at the end of backward too), ``comm_hidden_ms()`` the time it ran
hidden under backward; a "train" record carries both as seconds of its interval."""
import time

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(60)
SLOW_REDUCE_S = 0.03


def steps_worker(rank, world_size, overlap):
    """Three DDP steps of the Trainer's strategy whose bucket reductions each take
    SLOW_REDUCE_S; the waited and hidden milliseconds of each step."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import TrainingConfig
    from neural_arch.training.strategies import DataParallel
    manual_seed(0)
    model = MLP([6, 16, 2])
    strategy = DataParallel(overlap=overlap)
    strategy.setup(model, SGD(model.parameters(), lr=0.1), TrainingConfig(verbose=False,
                   progress_bar=False), None)
    arena = strategy.wrapper.ddp._storage
    assert arena.shared, "the shm backend's DDP keeps its buckets in shared memory"
    reduce_slice = arena._reduce_slice

    def slow(*args):
        time.sleep(SLOW_REDUCE_S)
        reduce_slice(*args)
    arena._reduce_slice = slow
    x = np.ones((4, 6), np.float32) * (rank + 1)
    y = np.arange(4) % 2
    out = []
    for _ in range(3):
        waited, hidden = strategy.comm_ms(), strategy.comm_hidden_ms()
        strategy.training_step((x, y), F.cross_entropy)
        out.append((strategy.comm_ms() - waited, strategy.comm_hidden_ms() - hidden))
    return out


@pytest.mark.parametrize("overlap", [True, False])
def test_a_step_counts_the_wait_for_its_buckets(overlap):
    for per_step in run_ranks(steps_worker, 2, "shm", args=(overlap,)):
        for waited_ms, hidden_ms in per_step:
            # one bucket, launched by the last gradient's hook: backward ends at once and
            # waits for it (before, overlap counted only the wait after backward: ~0 ms)
            assert waited_ms >= SLOW_REDUCE_S * 1e3 * 0.9, per_step
            assert 0.0 <= hidden_ms < waited_ms, per_step
            if not overlap:
                assert hidden_ms == 0.0


class _Strategy:
    grad_norm = 1.0

    def __init__(self):
        self.waited, self.hidden = 5.0, 2.0

    def comm_ms(self):
        return self.waited

    def comm_hidden_ms(self):
        return self.hidden


def test_train_record_carries_waited_and_hidden_seconds_of_its_interval(monkeypatch):
    from neural_arch.training import interval
    monkeypatch.setattr(interval, "all_reduce", lambda values, op, group=None: values)
    strategy = _Strategy()
    span = interval.TrainInterval(strategy)
    span.begin_batch()
    span.add(1.0, 4)
    span.stepped()
    strategy.waited, strategy.hidden = 8.0, 9.5
    record = span.flush(None, None, 0.1)
    assert record["comm_seconds"] == pytest.approx(0.003)
    assert record["comm_hidden_seconds"] == pytest.approx(0.0075)
    strategy.waited, strategy.hidden = 8.5, 9.5
    record = span.flush(None, None, 0.1)
    assert record["comm_seconds"] == pytest.approx(0.0005) and record["comm_hidden_seconds"] == 0
