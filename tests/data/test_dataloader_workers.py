"""DataLoader(num_workers > 0): real worker processes give num_workers=0's batches, in order,
with torch's worker_init_fn, get_worker_info and per-worker seeding."""
import os

import numpy as np
import pytest

from neural_arch.core import manual_seed
from neural_arch.data import DataLoader, TensorDataset, get_worker_info
from worker_leftovers import leftovers  # noqa: F401 - no worker outlives a test
from worker_datasets import Probe, Rows, keep_items, record_init

pytestmark = pytest.mark.timeout(60)


def _arrays(batches):
    return [tuple(np.array(field.array) for field in batch) for batch in batches]


def _assert_same_batches(expected, got):
    assert len(got) == len(expected)
    for want, have in zip(expected, got):
        for a, b in zip(want, have):
            assert a.dtype == b.dtype
            np.testing.assert_array_equal(a, b)


def _table(n=23):
    return TensorDataset(np.arange(n * 3, dtype=np.float32).reshape(n, 3), np.arange(n))


@pytest.mark.parametrize("num_workers", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_give_the_single_process_batches_in_order(num_workers, drop_last):
    for dataset in (_table(23), Rows(23)):  # whole-batch fetch, and collated items
        def loader(workers):
            return DataLoader(dataset, batch_size=4, shuffle=True, seed=11, drop_last=drop_last,
                              num_workers=workers)
        single = loader(0)
        with_workers = loader(num_workers)
        assert len(with_workers) == len(single) == (5 if drop_last else 6)
        for _ in range(2):  # the second epoch has a new permutation, the same on both
            _assert_same_batches(_arrays(single), _arrays(with_workers))


def test_global_seed_shuffles_alike_with_and_without_workers():
    def two_epochs(workers):
        manual_seed(5)
        loader = DataLoader(_table(17), batch_size=5, shuffle=True, num_workers=workers)
        return [np.concatenate([b[1].array for b in loader]) for _ in range(2)]
    without, with_workers = two_epochs(0), two_epochs(2)
    assert not np.array_equal(without[0], without[1])
    for a, b in zip(without, with_workers):
        np.testing.assert_array_equal(a, b)


def test_same_batches_as_torch_for_a_sequential_sampler():
    torch = pytest.importorskip("torch")
    dataset = Rows(10)
    ours = [(b[0].array, b[1].array) for b in DataLoader(dataset, batch_size=3, num_workers=2)]
    theirs = [(x.numpy(), y.numpy()) for x, y in
              torch.utils.data.DataLoader(dataset, batch_size=3, num_workers=2)]
    assert len(ours) == len(theirs) == 4
    for (x, y), (tx, ty) in zip(ours, theirs):
        np.testing.assert_array_equal(x, tx)
        np.testing.assert_array_equal(y, ty)


def test_worker_info_init_fn_and_seeds():
    assert get_worker_info() is None  # in the main process
    loader = DataLoader(Probe(12), batch_size=2, num_workers=3, seed=4,
                        worker_init_fn=record_init, collate_fn=keep_items)
    items = [item for batch in loader for item in batch]
    assert [item["index"] for item in items] == list(range(12))
    by_worker = {}
    for item in items:
        worker = (item["index"] // 2) % 3  # batch k goes to worker k mod num_workers
        assert item["worker"] == worker and item["num_workers"] == 3
        assert item["inits"] == [worker]  # worker_init_fn ran once, in this worker only
        assert item["dataset_is_probe"] and item["pid"] != os.getpid()
        by_worker.setdefault(worker, set()).add(item["seed"])
    seeds = [by_worker[w].pop() for w in range(3)]
    assert seeds[1] == seeds[0] + 1 and seeds[2] == seeds[0] + 2  # base_seed + worker_id
    for key in ("numpy", "random", "ours"):  # each worker's generators are seeded differently
        assert len({items[2 * w][key] for w in range(3)}) == 3

    def draws(loader):
        return [(i["numpy"], i["random"], i["ours"], i["seed"]) for b in loader for i in b]
    first_epoch = [(i["numpy"], i["random"], i["ours"], i["seed"]) for i in items]
    assert draws(DataLoader(Probe(12), batch_size=2, num_workers=3, seed=4,
                            collate_fn=keep_items)) == first_epoch  # reproducible
    assert draws(loader) != first_epoch  # a new base seed every epoch, as torch
    manual_seed(9)
    unseeded = draws(DataLoader(Probe(6), batch_size=2, num_workers=2, collate_fn=keep_items))
    manual_seed(9)
    assert draws(DataLoader(Probe(6), batch_size=2, num_workers=2,
                            collate_fn=keep_items)) == unseeded


def test_reproducible_seeded_epochs():
    def run():
        loader = DataLoader(Probe(8), batch_size=2, num_workers=2, seed=1, collate_fn=keep_items)
        return [[(i["numpy"], i["random"], i["ours"]) for b in loader for i in b]
                for _ in range(2)]
    assert run() == run()


def test_spawn_context_gives_the_same_batches():
    dataset = Rows(9)
    expected = _arrays(DataLoader(dataset, batch_size=2))
    spawned = DataLoader(dataset, batch_size=2, num_workers=2, multiprocessing_context="spawn",
                         worker_init_fn=record_init)
    _assert_same_batches(expected, _arrays(spawned))


def test_worker_options_are_checked_by_name():
    dataset = _table(4)
    with pytest.raises(ValueError, match="prefetch_factor must be a positive integer, got 0"):
        DataLoader(dataset, num_workers=1, prefetch_factor=0)
    with pytest.raises(ValueError, match="timeout must be a non-negative number of seconds, "
                                         "got -1"):
        DataLoader(dataset, num_workers=1, timeout=-1)
    with pytest.raises(ValueError, match="multiprocessing_context='nope' is not a start method"):
        DataLoader(dataset, num_workers=1, multiprocessing_context="nope")
    with pytest.raises(TypeError, match="worker_init_fn must be callable, got int"):
        DataLoader(dataset, num_workers=1, worker_init_fn=3)
    assert DataLoader(dataset, num_workers=2).prefetch_factor == 2
