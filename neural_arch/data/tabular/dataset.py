"""``TabularDataset``: a table's rows encoded by a fitted ``TabularPreprocessor``.

Items are ``(x_num, x_cat, y)`` (``(x_num, x_cat)`` without a target column), one row each, so
``DataLoader`` batches them and ``DistributedSampler`` splits them across ranks as any other
dataset. The preprocessor must already be fitted, on the training rows: a dataset never fits
it, so test rows cannot leak into the statistics.
"""
from __future__ import annotations

import os
from typing import Any, Optional, Sequence, Tuple

import numpy as np

from ..dataset import Dataset
from .preprocessor import TabularPreprocessor
from .table import as_table, read_csv, take_rows

__all__ = ["TabularDataset", "split_datasets"]


class TabularDataset(Dataset):
    """Rows of ``table`` (a dict of columns, a NumPy array, a pandas DataFrame) encoded by
    ``preprocessor``."""

    def __init__(self, table: Any, preprocessor: TabularPreprocessor,
                 columns: Optional[Sequence[str]] = None) -> None:
        if not isinstance(preprocessor, TabularPreprocessor):
            raise TypeError(f"TabularDataset needs a TabularPreprocessor, got "
                            f"{type(preprocessor).__name__}")
        if not preprocessor.fitted:
            raise RuntimeError("TabularDataset: the preprocessor is not fitted; call "
                               "preprocessor.fit(train_table) on the training rows first")
        self.preprocessor = preprocessor
        encoded = preprocessor.transform(as_table(table, columns) if columns is not None
                                         else as_table(table))
        self.x_num, self.x_cat, self.y = encoded.x_num, encoded.x_cat, encoded.y

    @classmethod
    def from_numpy(cls, array: np.ndarray, preprocessor: TabularPreprocessor,
                   columns: Optional[Sequence[str]] = None) -> "TabularDataset":
        """A 2-D array's rows; ``columns`` names its columns (else ``x0, x1, ...``)."""
        return cls(array, preprocessor, columns=columns)

    @classmethod
    def from_pandas(cls, frame: Any, preprocessor: TabularPreprocessor) -> "TabularDataset":
        return cls(frame, preprocessor)

    @classmethod
    def from_csv(cls, path: "os.PathLike[str] | str", preprocessor: TabularPreprocessor,
                 delimiter: str = ",") -> "TabularDataset":
        return cls(read_csv(path, delimiter=delimiter), preprocessor)

    def __len__(self) -> int:
        return len(self.x_num)

    def __getitem__(self, index: int) -> Tuple[np.ndarray, ...]:
        if self.y is None:
            return self.x_num[index], self.x_cat[index]
        return self.x_num[index], self.x_cat[index], self.y[index]

    def arrays(self) -> Tuple[Any, ...]:
        """All rows at once: ``(x_num, x_cat, y)``, for full-batch evaluation."""
        return self.x_num, self.x_cat, self.y


def split_datasets(table: Any, preprocessor: TabularPreprocessor, test_fraction: float = 0.2,
                   seed: int = 0) -> Tuple[TabularDataset, TabularDataset]:
    """Train and test datasets from one table: a random ``test_fraction`` of the rows (from
    ``seed``) is held out, and ``preprocessor`` is fitted on the other rows only."""
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    table = as_table(table)
    rows = len(next(iter(table.values())))
    order = np.random.default_rng(seed).permutation(rows)
    n_test = int(round(rows * test_fraction))
    if n_test == 0 or n_test == rows:
        raise ValueError(f"test_fraction {test_fraction} of {rows} rows leaves an empty split")
    train, test = take_rows(table, order[n_test:]), take_rows(table, order[:n_test])
    preprocessor.fit(train)
    return TabularDataset(train, preprocessor), TabularDataset(test, preprocessor)
