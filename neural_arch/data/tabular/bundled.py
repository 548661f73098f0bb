"""scikit-learn's bundled tables (no download): breast cancer, wine, diabetes, digits.

Each loader returns the whole table, its target column included, and the target's name; split
it (``split_datasets``, or the folds of a cross-validation) before fitting a preprocessor.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Dict, Tuple

import numpy as np

from .table import Table

__all__ = ["BUNDLED_TABLES", "load_bundled"]

TARGET = "target"


def _sklearn_loader(name: str) -> Callable[[], object]:
    from sklearn import datasets

    return {"breast_cancer": datasets.load_breast_cancer, "wine": datasets.load_wine,
            "diabetes": datasets.load_diabetes, "digits": datasets.load_digits}[name]


# what each set is, for the docs and the error of an unknown name
BUNDLED_TABLES: Dict[str, str] = {
    "breast_cancer": "569 rows, 30 numeric columns, 2 classes",
    "wine": "178 rows, 13 numeric columns, 3 classes",
    "diabetes": "442 rows, 10 numeric columns, a real-valued target (regression)",
    "digits": "1797 rows, 64 numeric columns (8x8 pixels), 10 classes",
}


def load_bundled(name: str) -> Tuple[Table, str]:
    """``(table, target_name)`` of a scikit-learn bundled set; features are float64, the
    target int64 for the classification sets and float64 for diabetes."""
    if name not in BUNDLED_TABLES:
        raise ValueError(f"no bundled table {name!r}; there are {sorted(BUNDLED_TABLES)}")
    bunch = _sklearn_loader(name)()
    names = [str(n) for n in bunch.feature_names]
    table: Table = OrderedDict((n, np.asarray(bunch.data[:, i], dtype=np.float64))
                               for i, n in enumerate(names))
    target = np.asarray(bunch.target)
    table[TARGET] = target.astype(np.float64) if name == "diabetes" else target.astype(np.int64)
    return table, TARGET
