"""random_split with torch's semantics: lengths or fractions, a fresh split per call unless a
seeded generator (or manual_seed) fixes it."""
import warnings

import numpy as np
import pytest

from neural_arch.core import manual_seed
from neural_arch.data import TensorDataset, random_split

pytestmark = pytest.mark.timeout(30)


def _items(n):
    return TensorDataset(np.arange(n))


def _order(parts):
    return np.concatenate([p.indices for p in parts])


def test_fractions_give_torchs_lengths():
    torch = pytest.importorskip("torch")
    for n, lengths in [(10, [0.5, 0.5]), (11, [0.3, 0.3, 0.4]), (7, [0.2, 0.2, 0.2, 0.2, 0.2]),
                       (10, [1, 0]), (25, [10, 10, 5]), (3, [0.0, 1.0])]:
        with warnings.catch_warnings(record=True) as ours_warned:
            warnings.simplefilter("always")
            ours = [len(p) for p in random_split(_items(n), lengths)]
        with warnings.catch_warnings(record=True) as torch_warned:
            warnings.simplefilter("always")
            theirs = [len(p) for p in torch.utils.data.random_split(range(n), lengths)]
        assert ours == theirs, (n, lengths)
        assert [str(w.message) for w in ours_warned] == [str(w.message) for w in torch_warned]


def test_unseeded_splits_differ_seeded_ones_repeat():
    dataset = _items(50)
    assert not np.array_equal(_order(random_split(dataset, [25, 25])),
                              _order(random_split(dataset, [25, 25])))
    fixed = _order(random_split(dataset, [0.5, 0.5], np.random.default_rng(42)))
    assert np.array_equal(fixed, _order(random_split(dataset, [25, 25],
                                                     generator=np.random.default_rng(42))))
    assert np.array_equal(np.sort(fixed), np.arange(50))  # a disjoint cover
    manual_seed(3)
    first = _order(random_split(dataset, [20, 30]))
    manual_seed(3)
    assert np.array_equal(first, _order(random_split(dataset, [20, 30])))


def test_bad_lengths_and_generators_are_named():
    dataset = _items(10)
    with pytest.raises(ValueError, match="Fraction at index 0 is not between 0 and 1"):
        random_split(dataset, [1.5, -0.5])
    with pytest.raises(ValueError, match=r"split lengths \[4, 4\] do not add up to the dataset "
                                         r"length 10"):
        random_split(dataset, [4, 4])
    with pytest.raises(TypeError, match="generator must be a numpy.random.Generator, got int"):
        random_split(dataset, [5, 5], generator=3)
