"""``GlobalBatches``: a pipeline run's global batch of a step is what the data-parallel
program's ranks read at that step, replica by replica; a short last batch stays only when it
splits into the micro-batches."""
import numpy as np

from neural_arch.train_gpt.pipeline_data import GlobalBatches
from neural_arch.train_gpt.text import TokenWindows

WINDOW = 4


def windows(count):
    return TokenWindows(np.arange(count * WINDOW + 1), WINDOW)


def first_tokens(batches, epoch):
    """Each batch as the windows it holds (a window's first token / WINDOW)."""
    return [list(x[:, 0] // WINDOW) for x, _ in batches.epoch(epoch)]


def test_each_replicas_share_is_its_distributed_samplers_batch():
    from neural_arch.distributed import DistributedSampler
    data = windows(20)
    batches = GlobalBatches(data, per_replica=4, replicas=2, microbatches=2, shuffle=True,
                            seed=3)
    got = first_tokens(batches, epoch=1)
    assert len(got) == len(batches) == 3  # 10 windows per replica: 4, 4 and 2
    for replica in range(2):
        sampler = DistributedSampler(20, num_replicas=2, rank=replica, shuffle=True, seed=3)
        sampler.set_epoch(1)
        order = list(sampler.indices())
        share = [rows[len(rows) // 2 * replica:len(rows) // 2 * (replica + 1)] for rows in got]
        assert share == [order[0:4], order[4:8], order[8:10]]
    # one replica of 8 reads the same windows per step; another epoch, another shuffle
    single = first_tokens(GlobalBatches(data, 8, 1, 2, True, 3), epoch=1)
    assert [sorted(rows) for rows in single] == [sorted(rows) for rows in got]
    assert first_tokens(batches, epoch=2) != got


def test_a_short_last_batch_stays_only_when_it_splits_into_the_micro_batches():
    assert len(GlobalBatches(windows(10), 4, 1, 2, False, 0)) == 3   # 4, 4, 2
    assert len(GlobalBatches(windows(10), 4, 1, 4, False, 0)) == 2   # 2 rows in 4 parts: no
    assert len(GlobalBatches(windows(9), 4, 1, 1, False, 0)) == 3    # 4, 4, 1


def test_skip_resumes_inside_an_epoch():
    batches = GlobalBatches(windows(12), 4, 1, 1, True, 0)
    assert first_tokens(batches, 0)[2:] == [list(x[:, 0] // WINDOW)
                                            for x, _ in batches.epoch(0, skip=2)]
