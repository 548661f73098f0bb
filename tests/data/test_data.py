"""Datasets, DataLoader batching and shuffling, random_split and the bundled digits."""
import numpy as np
import pytest

from neural_arch.core import Tensor, manual_seed
from neural_arch.data import (CharDataset, DataLoader, Dataset, Subset, TensorDataset,
                              default_collate, load_digits, random_split)

pytestmark = pytest.mark.timeout(60)


def _dataset(n=23):
    features = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    labels = np.arange(n, dtype=np.int64)
    return TensorDataset(features, labels)


def _epoch_labels(loader):
    return [batch[1].array.copy() for batch in loader]


def test_tensor_dataset_items_and_length_mismatch():
    ds = _dataset(5)
    assert len(ds) == 5
    x, y = ds[2]
    np.testing.assert_array_equal(x, [6, 7, 8])
    assert y == 2
    with pytest.raises(ValueError, match=r"\[5, 4\]"):
        TensorDataset(np.zeros((5, 2)), np.zeros(4))
    wrapped = TensorDataset(Tensor(np.ones((3, 2), dtype=np.float64)), np.arange(3))
    assert wrapped.arrays[0].dtype == np.float64
    assert all(isinstance(t, Tensor) for t in wrapped.tensors)


@pytest.mark.parametrize("drop_last", [False, True])
def test_batches_cover_dataset_in_order(drop_last):
    loader = DataLoader(_dataset(23), batch_size=5, drop_last=drop_last)
    batches = list(loader)
    assert len(batches) == len(loader) == (4 if drop_last else 5)
    sizes = [len(b[1].array) for b in batches]
    assert sizes == ([5] * 4 if drop_last else [5, 5, 5, 5, 3])
    labels = np.concatenate([b[1].array for b in batches])
    np.testing.assert_array_equal(labels, np.arange(20 if drop_last else 23))
    x, y = batches[0]
    assert isinstance(x, Tensor) and isinstance(y, Tensor)
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (5, 3)
    np.testing.assert_array_equal(x.array, np.arange(15, dtype=np.float32).reshape(5, 3))


def test_shuffle_is_a_permutation_reproducible_and_new_each_epoch():
    ds = _dataset(40)
    loader = DataLoader(ds, batch_size=8, shuffle=True, seed=3)
    first, second = _epoch_labels(loader), _epoch_labels(loader)
    for epoch in (first, second):
        np.testing.assert_array_equal(np.sort(np.concatenate(epoch)), np.arange(40))
    assert not np.array_equal(np.concatenate(first), np.concatenate(second))
    again = DataLoader(ds, batch_size=8, shuffle=True, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(first, _epoch_labels(again)))
    assert all(np.array_equal(a, b) for a, b in zip(second, _epoch_labels(again)))
    other = DataLoader(ds, batch_size=8, shuffle=True, seed=4)
    assert not np.array_equal(np.concatenate(first), np.concatenate(_epoch_labels(other)))
    again.set_epoch(1)
    np.testing.assert_array_equal(np.concatenate(_epoch_labels(again)), np.concatenate(second))
    # features travel with their labels
    x, y = next(iter(loader))
    np.testing.assert_array_equal(x.array, ds.arrays[0][y.array])


def test_shuffle_without_seed_follows_manual_seed():
    ds = _dataset(30)
    manual_seed(11)
    a = np.concatenate(_epoch_labels(DataLoader(ds, batch_size=7, shuffle=True)))
    manual_seed(11)
    b = np.concatenate(_epoch_labels(DataLoader(ds, batch_size=7, shuffle=True)))
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, np.arange(30))


def test_sampler_decides_the_indices():
    from neural_arch.distributed.ddp.sampler import DistributedSampler

    ds = _dataset(10)
    loader = DataLoader(ds, batch_size=4, sampler=[9, 1, 1, 4, 0])
    np.testing.assert_array_equal(np.concatenate(_epoch_labels(loader)), [9, 1, 1, 4, 0])
    assert len(loader) == 2
    sampler = DistributedSampler(len(ds), num_replicas=3, rank=1, shuffle=True, seed=5)
    loader = DataLoader(ds, batch_size=2, sampler=sampler)
    np.testing.assert_array_equal(np.concatenate(_epoch_labels(loader)), list(sampler))
    with pytest.raises(ValueError, match="mutually exclusive"):
        DataLoader(ds, sampler=[0], shuffle=True)
    with pytest.raises(ValueError, match="0"):
        DataLoader(ds, batch_size=0)


def test_torch_loading_options_are_accepted_or_refused_by_name():
    ds = _dataset(10)
    loader = DataLoader(ds, batch_size=4, num_workers=0, pin_memory=True,
                        persistent_workers=False, timeout=0, worker_init_fn=print,
                        prefetch_factor=None)
    assert loader.num_workers == 0 and loader.pin_memory
    np.testing.assert_array_equal(np.concatenate(_epoch_labels(loader)), np.arange(10))
    assert DataLoader(ds, num_workers=2).num_workers == 2  # workers: test_dataloader_workers
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="num_workers must be a non-negative integer"):
            DataLoader(ds, num_workers=bad)
    with pytest.raises(ValueError, match="persistent_workers=True needs worker processes"):
        DataLoader(ds, persistent_workers=True)
    with pytest.raises(ValueError, match="prefetch_factor=2 applies to worker processes"):
        DataLoader(ds, prefetch_factor=2)
    with pytest.raises(ValueError, match="timeout=5 applies to worker processes"):
        DataLoader(ds, timeout=5)


class Pairs(Dataset):
    """A dataset without a batch fast path: collation goes item by item."""

    def __len__(self):
        return 6

    def __getitem__(self, i):
        return {"x": np.full(2, i, dtype=np.float64), "y": i, "w": 0.5 * i, "name": f"item{i}"}


def test_default_collate_item_by_item():
    batch = next(iter(DataLoader(Pairs(), batch_size=4)))
    assert batch["x"].dtype == np.float64 and batch["x"].shape == (4, 2)
    np.testing.assert_array_equal(batch["y"].array, [0, 1, 2, 3])
    assert batch["y"].dtype == np.int64 and batch["w"].dtype == np.float32
    assert batch["name"] == ["item0", "item1", "item2", "item3"]
    with pytest.raises(ValueError, match=r"\(2,\)"):
        default_collate([np.zeros(2), np.zeros(3)])


class Strided(Dataset):
    """Items are non-contiguous views and NumPy scalars."""

    def __init__(self):
        self.table = np.arange(40, dtype=np.int32).reshape(5, 8)

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return self.table[i, ::2], np.float64(i) / 2


def test_default_collate_strided_items_and_numpy_scalars():
    x, w = next(iter(DataLoader(Strided(), batch_size=5)))
    np.testing.assert_array_equal(x.array, np.arange(40, dtype=np.int32).reshape(5, 8)[:, ::2])
    assert x.dtype == np.int32 and w.dtype == np.float64
    np.testing.assert_array_equal(w.array, np.arange(5) / 2)
    strided = TensorDataset(np.arange(20.0).reshape(10, 2)[::2, 1], np.arange(5))
    np.testing.assert_array_equal(strided.arrays[0], [1.0, 5.0, 9.0, 13.0, 17.0])


def test_custom_collate_fn_gets_the_samples():
    loader = DataLoader(_dataset(6), batch_size=3,
                        collate_fn=lambda items: [int(y) for _, y in items])
    assert list(loader) == [[0, 1, 2], [3, 4, 5]]


def test_random_split_is_a_disjoint_cover():
    ds = _dataset(25)
    parts = random_split(ds, [10, 10, 5], seed=0)
    labels = [np.array([p[i][1] for i in range(len(p))]) for p in parts]
    assert [len(x) for x in labels] == [10, 10, 5]
    np.testing.assert_array_equal(np.sort(np.concatenate(labels)), np.arange(25))
    again = random_split(ds, [10, 10, 5], seed=0)
    np.testing.assert_array_equal(again[0].indices, parts[0].indices)
    assert [len(p) for p in random_split(ds, [0.5, 0.3, 0.2], seed=1)] == [13, 7, 5]  # as PyTorch
    with pytest.raises(ValueError, match="25"):
        random_split(ds, [10, 10])
    # a loader over a subset uses the fast path and returns the subset's rows
    batch = next(iter(DataLoader(parts[1], batch_size=10)))
    np.testing.assert_array_equal(batch[1].array, parts[1].indices)
    assert isinstance(parts[1], Subset)


def test_load_digits_split():
    from sklearn.datasets import load_digits as sklearn_digits

    train, test = load_digits(test_fraction=0.25, seed=2)
    assert len(train) + len(test) == 1797 and len(test) == round(1797 * 0.25)
    x, y = train.arrays
    assert x.dtype == np.float32 and y.dtype == np.int64 and x.shape == (len(train), 64)
    assert x.min() == 0.0 and x.max() == 1.0
    reference = sklearn_digits()
    rows = {tuple(r) for r in (reference.data / 16.0).astype(np.float32)}
    assert all(tuple(r) in rows for r in test.arrays[0][:50])
    order = np.random.default_rng(2).permutation(1797)
    np.testing.assert_array_equal(test.arrays[1], reference.target[order[:len(test)]])
    again_train, _ = load_digits(test_fraction=0.25, seed=2)
    np.testing.assert_array_equal(again_train.arrays[0], x)
    with pytest.raises(ValueError, match="1.5"):
        load_digits(test_fraction=1.5)


def test_digits_are_scikit_learns_without_importing_it():
    import subprocess
    import sys
    probe = ("import sys; from neural_arch.data.digits import digits_table; t = digits_table(); "
             "print(t.shape, 'sklearn' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                         timeout=60)
    assert out.stdout.split() == ["(1797,", "65)", "False"], out.stdout + out.stderr
    from sklearn.datasets import load_digits as sklearn_digits

    from neural_arch.data import digits
    reference = sklearn_digits()
    table = digits.digits_table()
    np.testing.assert_array_equal(table[:, :-1], reference.data)  # the same bits
    np.testing.assert_array_equal(table[:, -1].astype(np.int64), reference.target)
    train, test = load_digits(seed=4)  # as the loader made them from scikit-learn's arrays
    order, n_test = np.random.default_rng(4).permutation(1797), round(1797 * 0.2)
    np.testing.assert_array_equal(train.arrays[0],
                                  (reference.data[order[n_test:]] / 16.0).astype(np.float32))
    np.testing.assert_array_equal(test.arrays[1], reference.target[order[:n_test]])


def test_digits_fall_back_to_scikit_learns_loader(monkeypatch):
    from sklearn.datasets import load_digits as sklearn_digits

    from neural_arch.data import digits
    monkeypatch.setattr(digits, "_BUNDLED", ("no", "such", "file.csv.gz"))
    reference = sklearn_digits()
    np.testing.assert_array_equal(digits.digits_table(),
                                  np.column_stack([reference.data, reference.target]))


def test_char_dataset_through_loader_matches_items():
    ds = CharDataset("hello world, hello there", block_size=5)
    loader = DataLoader(ds, batch_size=4, shuffle=True, seed=0)
    x, y = next(iter(loader))
    assert x.dtype == np.int64 and x.shape == (4, 5)
    order = np.random.default_rng((0, 0)).permutation(len(ds))[:4]
    for row, index in enumerate(order):
        np.testing.assert_array_equal(x.array[row], ds[int(index)][0])
        np.testing.assert_array_equal(y.array[row], ds[int(index)][1])
