"""``TabularPreprocessor``: column types, standardisation and category vocabularies, fitted on
the training rows only and kept (as JSON) with the model that was trained on them.

``fit(train_table)`` decides each column's kind (given, or inferred: numbers are numeric, text
and booleans categorical), takes each numeric column's mean and standard deviation and each
categorical column's vocabulary from the training rows, and the target's classes (or, for
regression, its mean and standard deviation). ``transform(table)`` then applies exactly those
statistics to any rows: numbers standardised with NaN where a cell is missing, categories as
codes with -1 where a cell is missing or holds a category the training rows never had.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .columns import category_key, column_numbers, infer_kind, vocabulary_order
from .table import Table, as_table, column_is_missing

__all__ = ["EncodedRows", "TabularPreprocessor", "PREPROCESSOR_FILE"]

PREPROCESSOR_FILE = "preprocessor.json"  # its name inside a save_pretrained folder
_FORMAT = "neural_arch.tabular.preprocessor/1"
TASKS = ("classification", "regression")


@dataclass
class EncodedRows:
    """The model's inputs: ``x_num`` (rows, n_numerical) float32, ``x_cat`` (rows,
    n_categorical) int64, ``y`` class indices (int64) or standardised values (float32), or
    None when the table had no target column."""

    x_num: np.ndarray
    x_cat: np.ndarray
    y: Optional[np.ndarray]


class TabularPreprocessor:
    """Fit on the training table, transform any table of the same columns.

    ``target`` names the label column (kept out of the features); ``numerical`` and
    ``categorical`` fix the kind of the columns they name, the others are inferred. ``task`` is
    ``"classification"`` or ``"regression"``; by default a float target is regression, any
    other target classification.
    """

    def __init__(self, target: Optional[str] = None, numerical: Optional[Sequence[str]] = None,
                 categorical: Optional[Sequence[str]] = None, task: Optional[str] = None) -> None:
        if task is not None and task not in TASKS:
            raise ValueError(f"task must be one of {TASKS} or None, got {task!r}")
        self.target, self.task = target, task
        self.numerical = None if numerical is None else [str(c) for c in numerical]
        self.categorical = None if categorical is None else [str(c) for c in categorical]
        both = sorted(set(self.numerical or ()) & set(self.categorical or ()))
        if both:
            raise ValueError(f"columns {both} are listed as both numerical and categorical")
        if target is not None and target in (self.numerical or []) + (self.categorical or []):
            raise ValueError(f"the target column {target!r} is also listed as a feature")
        self.fitted = False

    # ------------------------------------------------------------------ fitting
    def fit(self, table: Any) -> "TabularPreprocessor":
        table = as_table(table)
        named = (self.numerical or []) + (self.categorical or []) + \
            ([self.target] if self.target is not None else [])
        absent = [name for name in named if name not in table]
        if absent:
            raise ValueError(f"fit: no column {absent[0]!r} in the table (columns: "
                             f"{list(table)})")
        kinds = {}
        for name, values in table.items():
            if name == self.target:
                continue
            if name in (self.numerical or ()):
                kinds[name] = "numerical"
            elif name in (self.categorical or ()):
                kinds[name] = "categorical"
            else:
                kinds[name] = infer_kind(values)
        self.numerical_columns = [n for n, kind in kinds.items() if kind == "numerical"]
        self.categorical_columns = [n for n, kind in kinds.items() if kind == "categorical"]
        if not kinds:
            raise ValueError("fit: the table has no feature columns besides the target")
        self.means, self.stds = [], []
        for name in self.numerical_columns:
            numbers = column_numbers(name, table[name])
            present = numbers[~np.isnan(numbers)]
            mean = float(present.mean()) if present.size else 0.0
            std = float(present.std()) if present.size else 1.0
            self.means.append(mean)
            self.stds.append(std if std > 0 else 1.0)
        self.vocabularies = []
        for name in self.categorical_columns:
            values = table[name]
            keys = {category_key(v) for v, gone in zip(values.tolist(), column_is_missing(values))
                    if not gone}
            if not keys:
                raise ValueError(f"fit: categorical column {name!r} has no present values")
            self.vocabularies.append(sorted(keys, key=vocabulary_order))
        self._fit_target(table)
        self.fitted = True
        return self

    def _fit_target(self, table: Table) -> None:
        self.target_labels, self.target_mean, self.target_std = None, None, None
        if self.target is None:
            return
        values = table[self.target]
        if column_is_missing(values).any():
            raise ValueError(f"fit: the target column {self.target!r} has missing values")
        task = self.task or ("regression" if values.dtype.kind == "f" else "classification")
        self.task = task
        if task == "regression":
            numbers = column_numbers(self.target, values)
            self.target_mean, std = float(numbers.mean()), float(numbers.std())
            self.target_std = std if std > 0 else 1.0
        else:
            keys = {category_key(v) for v in values.tolist()}
            self.target_labels = sorted(keys, key=vocabulary_order)

    def fit_transform(self, table: Any) -> EncodedRows:
        return self.fit(table).transform(table)

    # ------------------------------------------------------------------ applying
    def _require_fitted(self, what: str) -> None:
        if not self.fitted:
            raise RuntimeError(f"TabularPreprocessor.{what}: not fitted; call "
                               f"fit(train_table) on the training rows first")

    def transform(self, table: Any) -> EncodedRows:
        self._require_fitted("transform")
        table = as_table(table)
        features = self.numerical_columns + self.categorical_columns
        unknown = [name for name in table if name not in features and name != self.target]
        if unknown:
            raise ValueError(f"transform: unknown column {unknown[0]!r} (the preprocessor was "
                             f"fitted on {features}, target {self.target!r})")
        absent = [name for name in features if name not in table]
        if absent:
            raise ValueError(f"transform: the table lacks column {absent[0]!r}")
        rows = len(next(iter(table.values())))
        x_num = np.empty((rows, len(self.numerical_columns)), dtype=np.float32)
        for j, name in enumerate(self.numerical_columns):
            x_num[:, j] = (column_numbers(name, table[name]) - self.means[j]) / self.stds[j]
        x_cat = np.empty((rows, len(self.categorical_columns)), dtype=np.int64)
        for j, name in enumerate(self.categorical_columns):
            codes = {key: code for code, key in enumerate(self.vocabularies[j])}
            values = table[name]
            missing = column_is_missing(values)
            x_cat[:, j] = [-1 if gone else codes.get(category_key(v), -1)
                           for v, gone in zip(values.tolist(), missing)]
        y = self._encode_target(table[self.target]) if self.target in table else None
        return EncodedRows(x_num, x_cat, y)

    def _encode_target(self, values: np.ndarray) -> np.ndarray:
        if column_is_missing(values).any():
            row = int(np.argmax(column_is_missing(values)))
            raise ValueError(f"transform: the target column {self.target!r} is missing at row "
                             f"{row}")
        if self.task == "regression":
            return ((column_numbers(self.target, values) - self.target_mean)
                    / self.target_std).astype(np.float32)
        index = {key: i for i, key in enumerate(self.target_labels)}
        out = np.empty(len(values), dtype=np.int64)
        for i, value in enumerate(values.tolist()):
            key = category_key(value)
            if key not in index:
                raise ValueError(f"transform: target {self.target!r} has the label {value!r} "
                                 f"(row {i}), unseen in training (labels {self.target_labels})")
            out[i] = index[key]
        return out

    def decode_target(self, y: Any) -> np.ndarray:
        """Model outputs back in the target's units: class indices to labels (as strings),
        standardised values to the original scale."""
        self._require_fitted("decode_target")
        y = np.asarray(getattr(y, "array", y))
        if self.task == "regression":
            return y.astype(np.float64) * self.target_std + self.target_mean
        if self.task == "classification":
            return np.asarray(self.target_labels, dtype=object)[y.astype(np.int64)]
        raise ValueError("decode_target: the preprocessor was fitted without a target")

    # ------------------------------------------------------------------ the model's shape
    @property
    def n_numerical(self) -> int:
        self._require_fitted("n_numerical")
        return len(self.numerical_columns)

    @property
    def categorical_cardinalities(self) -> List[int]:
        self._require_fitted("categorical_cardinalities")
        return [len(v) for v in self.vocabularies]

    def model_config(self) -> Dict[str, Any]:
        """The ``TabGPTConfig`` fields these columns and this target fix."""
        self._require_fitted("model_config")
        config: Dict[str, Any] = {"n_numerical": self.n_numerical,
                                  "categorical_cardinalities": self.categorical_cardinalities}
        if self.task == "classification":
            config.update(num_labels=len(self.target_labels),
                          problem_type="single_label_classification")
        elif self.task == "regression":
            config.update(num_labels=1, problem_type="regression")
        return config

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> Dict[str, Any]:
        self._require_fitted("to_dict")
        return {"format": _FORMAT, "target": self.target, "task": self.task,
                "numerical": [{"name": n, "mean": m, "std": s} for n, m, s
                              in zip(self.numerical_columns, self.means, self.stds)],
                "categorical": [{"name": n, "categories": v} for n, v
                                in zip(self.categorical_columns, self.vocabularies)],
                "target_labels": self.target_labels, "target_mean": self.target_mean,
                "target_std": self.target_std}

    @classmethod
    def from_dict(cls, values: Dict[str, Any]) -> "TabularPreprocessor":
        if not isinstance(values, dict) or values.get("format") != _FORMAT:
            found = values.get("format") if isinstance(values, dict) else type(values).__name__
            raise ValueError(f"not a fitted TabularPreprocessor (format {found!r}, expected "
                             f"{_FORMAT!r})")
        numerical, categorical = values["numerical"], values["categorical"]
        prep = cls(target=values["target"], task=values["task"],
                   numerical=[c["name"] for c in numerical],
                   categorical=[c["name"] for c in categorical])
        prep.numerical_columns, prep.categorical_columns = prep.numerical, prep.categorical
        prep.means = [float(c["mean"]) for c in numerical]
        prep.stds = [float(c["std"]) for c in numerical]
        prep.vocabularies = [[str(k) for k in c["categories"]] for c in categorical]
        prep.target_labels = values["target_labels"]
        prep.target_mean, prep.target_std = values["target_mean"], values["target_std"]
        prep.fitted = True
        return prep

    def save(self, path: "os.PathLike[str] | str") -> None:
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(self.to_dict(), handle, indent=2)
            handle.write("\n")

    @classmethod
    def load(cls, path: "os.PathLike[str] | str") -> "TabularPreprocessor":
        with open(path, encoding="utf-8") as handle:
            return cls.from_dict(json.load(handle))

    @classmethod
    def from_pretrained(cls, folder: "os.PathLike[str] | str") -> "TabularPreprocessor":
        """The preprocessor a model's ``save_pretrained(folder, preprocessor=...)`` stored."""
        path = os.path.join(os.fspath(folder), PREPROCESSOR_FILE)
        if not os.path.isfile(path):
            raise ValueError(f"no {PREPROCESSOR_FILE} in {os.fspath(folder)!r}: pass "
                             f"preprocessor= to save_pretrained to keep it with the model")
        return cls.load(path)
