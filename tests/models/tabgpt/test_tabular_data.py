"""Tables from NumPy, CSV and pandas; the preprocessor fitted on training rows only; errors
that name the column and value; encoded rows through DataLoader into TabGPT."""
import numpy as np
import pytest

from neural_arch.data import DataLoader
from neural_arch.data.tabular import (TabularDataset, TabularPreprocessor, as_table,
                                      load_bundled, read_csv, split_datasets, take_rows)
from neural_arch.models.tabgpt import TabGPTConfig, TabGPTForSequenceClassification

pytestmark = pytest.mark.timeout(60)


def shifted_table():
    """Training rows 0-5 and test rows 6-9 on other scales, with a test-only category."""
    return {
        "income": np.array([1, 2, 3, 4, 5, 6, 100, 200, 300, 400], dtype=np.float64),
        "city": np.array(["a", "b", "a", "b", "a", "b", "z", "z", "a", "b"], dtype=object),
        "label": np.array(["no", "yes", "no", "yes", "no", "yes", "no", "yes", "no", "yes"],
                          dtype=object),
    }


def test_statistics_come_from_the_training_rows_only():
    table = shifted_table()
    train, test = take_rows(table, np.arange(6)), take_rows(table, np.arange(6, 10))
    prep = TabularPreprocessor(target="label").fit(train)
    assert prep.numerical_columns == ["income"] and prep.categorical_columns == ["city"]
    assert prep.means == [3.5] and prep.vocabularies == [["a", "b"]]
    encoded_train, encoded_test = prep.transform(train), prep.transform(test)
    # standardised by the training rows: mean 0 there, far from 0 on the test rows
    np.testing.assert_allclose(encoded_train.x_num.mean(), 0.0, atol=1e-6)
    np.testing.assert_allclose(encoded_test.x_num[:, 0],
                               (np.array([100, 200, 300, 400]) - 3.5) / np.std(np.arange(1, 7)),
                               rtol=1e-6)
    np.testing.assert_array_equal(encoded_test.x_cat[:, 0], [-1, -1, 0, 1])  # "z": unseen
    np.testing.assert_array_equal(encoded_test.y, [0, 1, 0, 1])
    assert prep.decode_target(encoded_test.y).tolist() == ["no", "yes", "no", "yes"]


def test_split_datasets_fits_on_its_training_split():
    table = shifted_table()
    prep = TabularPreprocessor(target="label")
    train, test = split_datasets(table, prep, test_fraction=0.4, seed=1)
    order = np.random.default_rng(1).permutation(10)
    train_income = table["income"][order[4:]]
    assert prep.means == [pytest.approx(train_income.mean())]
    assert len(train) == 6 and len(test) == 4
    assert prep.means != [pytest.approx(table["income"].mean())]


def test_csv_columns_missing_cells_and_given_kinds(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_text("age,zip,colour,y\n30,1000,red,1.5\n,2000,NA,2.5\n50,1000,blue,3.5\n")
    table = read_csv(path)
    assert table["age"].dtype == np.float64 and np.isnan(table["age"][1])
    assert table["colour"].tolist() == ["red", None, "blue"]
    prep = TabularPreprocessor(target="y", categorical=["zip"]).fit(table)
    assert prep.task == "regression" and prep.model_config()["problem_type"] == "regression"
    assert prep.categorical_columns == ["zip", "colour"] and prep.vocabularies[0] == ["1000",
                                                                                      "2000"]
    data = TabularDataset.from_csv(path, prep)
    x_num, x_cat, y = data[1]
    assert np.isnan(x_num[0]) and x_cat.tolist() == [1, -1]
    np.testing.assert_allclose(prep.decode_target(data.y), [1.5, 2.5, 3.5], rtol=1e-6)
    again = TabularPreprocessor.from_dict(prep.to_dict())
    np.testing.assert_array_equal(again.transform(table).x_cat, prep.transform(table).x_cat)


def test_numpy_tables():
    array = np.array([[1.0, 0.0], [2.0, 1.0], [3.0, 1.0]])
    prep = TabularPreprocessor(target="t").fit(as_table(array, columns=["f", "t"]))
    assert prep.task == "regression"  # a float target
    assert TabularDataset.from_numpy(array, prep, columns=["f", "t"]).y.dtype == np.float32
    with pytest.raises(ValueError, match="2 column names for an array of 3 columns"):
        as_table(np.ones((2, 3)), columns=["a", "b"])


class DataFrame:
    """pandas' DataFrame as far as as_table reads it: ``columns`` and ``frame[name]
    .to_numpy()``, so the path runs where pandas is not installed."""

    def __init__(self, columns):
        self._columns = columns
        self.columns = list(columns)

    def __getitem__(self, name):
        return type("Series", (), {"to_numpy": lambda _: np.asarray(self._columns[name])})()

    def to_numpy(self):
        return np.stack([np.asarray(v) for v in self._columns.values()], axis=1)


def test_a_dataframe_without_pandas():
    frame = DataFrame({"f": np.array([1.0, np.nan, 3.0]),
                       "c": np.array(["x", "y", None], dtype=object), "t": np.array([0, 1, 1])})
    prep = TabularPreprocessor(target="t").fit(frame)
    data = TabularDataset.from_pandas(frame, prep)
    assert prep.categorical_columns == ["c"] and data.x_cat[:, 0].tolist() == [0, 1, -1]
    assert np.isnan(data.x_num[1, 0]) and data.y.tolist() == [0, 1, 1]


def test_pandas_tables():
    pd = pytest.importorskip("pandas")
    frame = pd.DataFrame({"f": [1.0, None, 3.0], "c": ["x", "y", None], "t": [0, 1, 1]})
    prep = TabularPreprocessor(target="t").fit(frame)
    data = TabularDataset.from_pandas(frame, prep)
    assert prep.categorical_columns == ["c"] and data.x_cat[:, 0].tolist() == [0, 1, -1]


def test_bad_tables_raise_with_names_and_values(tmp_path):
    table = shifted_table()
    prep = TabularPreprocessor(target="label").fit(table)
    with pytest.raises(ValueError, match="unknown column 'height'"):
        prep.transform({**table, "height": np.ones(10)})
    without_city = {k: v for k, v in table.items() if k != "city"}
    with pytest.raises(ValueError, match="lacks column 'city'"):
        prep.transform(without_city)
    text_income = {**table, "income": np.array(["1", "two"] + ["3"] * 8, dtype=object)}
    with pytest.raises(ValueError, match=r"numeric column 'income' holds 'two' \(row 1\)"):
        prep.transform(text_income)
    with pytest.raises(ValueError, match="label 'maybe'"):
        prep.transform({**table, "label": np.array(["maybe"] * 10, dtype=object)})
    with pytest.raises(ValueError, match="no column 'weight'"):
        TabularPreprocessor(target="label", numerical=["weight"]).fit(table)
    with pytest.raises(RuntimeError, match="not fitted"):
        TabularDataset(table, TabularPreprocessor(target="label"))
    with pytest.raises(ValueError, match="different lengths"):
        as_table({"a": np.ones(2), "b": np.ones(3)})
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n3\n")
    with pytest.raises(ValueError, match="line 3 has 1 fields, the header has 2"):
        read_csv(tmp_path / "bad.csv")
    with pytest.raises(ValueError, match="no bundled table 'iris'"):
        load_bundled("iris")


def test_bundled_table_batches_into_the_model():
    table, target = load_bundled("breast_cancer")
    assert len(table) == 31 and table[target].dtype == np.int64
    prep = TabularPreprocessor(target=target)
    train, _ = split_datasets(table, prep, test_fraction=0.5, seed=0)
    config = TabGPTConfig(**prep.model_config(), d_token=8, n_layers=1, n_heads=2)
    model = TabGPTForSequenceClassification(config)
    x_num, x_cat, y = next(iter(DataLoader(train, batch_size=16, shuffle=True)))
    assert x_num.shape == (16, 30) and x_cat.shape == (16, 0)
    out = model(x_num, x_cat, labels=y)
    assert out.logits.shape == (16, 2) and np.isfinite(out.loss.item())


def test_distributed_sampler_splits_the_rows_between_ranks():
    from neural_arch.utils.data.distributed import DistributedSampler
    table, target = load_bundled("wine")
    prep = TabularPreprocessor(target=target).fit(table)
    data = TabularDataset(table, prep)
    seen = []
    for rank in range(2):
        sampler = DistributedSampler(data, num_replicas=2, rank=rank, shuffle=True, seed=3)
        for x_num, _, y in DataLoader(data, batch_size=32, sampler=sampler):
            seen.extend(zip(x_num.numpy()[:, 0].tolist(), y.numpy().tolist()))
    assert len(seen) == len(data) == 178  # 178 rows split 89 + 89, none twice
    assert sorted(seen) == sorted(zip(data.x_num[:, 0].tolist(), data.y.tolist()))
