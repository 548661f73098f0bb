"""``SyntheticTable``: rows computed from their index, the same in every call, instance and
process, with the promised missing share, balanced categories and structure to learn."""
import numpy as np
import pytest

from neural_arch.data import DataLoader
from neural_arch.data.tabular import SyntheticTable

pytestmark = pytest.mark.timeout(30)


def test_rows_are_a_function_of_their_index():
    table = SyntheticTable(rows=1_000_000, seed=3)
    assert len(table) == 1_000_000 and table.n_features == 12
    picked = np.array([999_999, 0, 123_456, 0])
    x_num, x_cat, y = table.rows_at(picked)
    again = SyntheticTable(rows=1_000_000, seed=3).rows_at(picked[::-1])
    np.testing.assert_array_equal(again[0][::-1], x_num)
    np.testing.assert_array_equal(again[1][::-1], x_cat)
    np.testing.assert_array_equal(x_num[1], x_num[3])  # row 0 twice: the same row
    one_num, one_cat, one_y = table[123_456]
    np.testing.assert_array_equal(one_num, x_num[2])
    np.testing.assert_array_equal(one_cat, x_cat[2])
    assert one_y == y[2]
    other = SyntheticTable(rows=1_000_000, seed=4).rows_at(picked)[0]
    assert not np.allclose(np.nan_to_num(other), np.nan_to_num(x_num))  # the seed matters
    assert x_num.dtype == np.float32 and x_cat.dtype == np.int64 and y.dtype == np.int64


def test_columns_are_standardised_balanced_missing_as_asked_and_related():
    table = SyntheticTable(rows=50_000, missing_fraction=0.1)
    x_num, x_cat, y = table.rows_at(np.arange(50_000))
    assert abs(np.isnan(x_num).mean() - 0.1) < 0.01 and abs((x_cat < 0).mean() - 0.1) < 0.01
    np.testing.assert_allclose(np.nanmean(x_num, axis=0), 0.0, atol=0.03)
    np.testing.assert_allclose(np.nanstd(x_num, axis=0), 1.0, atol=0.03)
    for j, cardinality in enumerate(table.cardinalities):
        codes = x_cat[x_cat[:, j] >= 0, j]
        assert codes.max() < cardinality
        shares = np.bincount(codes, minlength=cardinality) / len(codes)
        np.testing.assert_allclose(shares, 1.0 / cardinality, atol=0.25 / cardinality)
    assert 0.45 < y.mean() < 0.55
    seen = ~np.isnan(x_num[:, 0]) & ~np.isnan(x_num[:, 1])
    correlation = np.corrcoef(x_num[seen, 0], x_num[seen, 1])[0, 1]
    assert abs(correlation) > 0.1  # shared hidden factors: something to learn


def test_a_loader_batches_it_and_bad_rows_are_errors():
    table = SyntheticTable(rows=100, seed=1)
    x_num, x_cat, y = next(iter(DataLoader(table, batch_size=8)))
    np.testing.assert_array_equal(np.asarray(x_cat), table.rows_at(np.arange(8))[1])
    with pytest.raises(IndexError, match=r"row 100 is outside \[0, 100\)"):
        table.rows_at([5, 100])
    with pytest.raises(ValueError, match="rows must be a positive int"):
        SyntheticTable(rows=0)
    with pytest.raises(ValueError, match="missing_fraction"):
        SyntheticTable(missing_fraction=1.0)
