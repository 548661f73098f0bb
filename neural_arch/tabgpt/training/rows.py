"""How a table's rows reach a TabGPT through the ``Trainer``.

The Trainer takes batches ``(inputs, target)``, counts a batch's rows from ``inputs.shape[0]``
and calls ``model(inputs, target)``. A table's rows are two arrays, ``x_num`` (float32, NaN
for a missing cell) and ``x_cat`` (int64 codes, -1 for missing), so ``TrainerRows`` packs them
side by side into one float64 array, which holds both exactly (every int64 code of a
vocabulary is far below 2**53, and NaN stays NaN); ``TabularTrainingModule`` splits them again
in front of the model and returns ``(logits, loss)`` for a head, ``(None, loss)`` for
pretraining. Its state dict is the model's under ``model.``.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np

from ...core import Tensor
from ...data import Dataset
from ...models.tabgpt import TabGPTForPreTraining
from ...nn import Module

__all__ = ["TabularTrainingModule", "TrainerRows", "rows_of"]


def rows_of(dataset: Any, what: str) -> Tuple[np.ndarray, np.ndarray, Optional[np.ndarray]]:
    """``dataset``'s (x_num, x_cat, y): a ``TabularDataset`` or anything with those arrays."""
    try:
        x_num, x_cat, y = dataset.x_num, dataset.x_cat, getattr(dataset, "y", None)
    except AttributeError:
        raise TypeError(f"{what} must be a TabularDataset (rows with x_num, x_cat and y), got "
                        f"{type(dataset).__name__}") from None
    x_num, x_cat = np.asarray(x_num), np.asarray(x_cat)
    if x_num.ndim != 2 or x_cat.ndim != 2 or len(x_num) != len(x_cat):
        raise ValueError(f"{what}: x_num and x_cat must be 2-D with one row per sample, got "
                         f"shapes {x_num.shape} and {x_cat.shape}")
    if y is not None and len(y) != len(x_num):
        raise ValueError(f"{what}: {len(y)} targets for {len(x_num)} rows")
    return x_num, x_cat, None if y is None else np.asarray(y)


class TrainerRows(Dataset):
    """Items ``(packed row, target)``; a missing target is -1 (no class, so no accuracy)."""

    def __init__(self, dataset: Any, what: str = "train_dataset") -> None:
        x_num, x_cat, y = rows_of(dataset, what)
        self.n_numerical = x_num.shape[1]
        self.packed = np.concatenate([x_num.astype(np.float64), x_cat.astype(np.float64)],
                                     axis=1)
        self.y = np.full(len(x_num), -1, dtype=np.int64) if y is None else y

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: int) -> Tuple[np.ndarray, Any]:
        return self.packed[index], self.y[index]

    def _fetch_batch(self, indices: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
        return self.packed[indices], self.y[indices]


class TabularTrainingModule(Module):
    """``forward(packed, target)`` for the Trainer around a TabGPT ``model``."""

    def __init__(self, model: Module) -> None:
        super().__init__()
        config = getattr(model, "config", None)
        if config is None or not hasattr(config, "n_numerical"):
            raise TypeError(f"the model must be a TabGPT model (with a TabGPTConfig), got "
                            f"{type(model).__name__}")
        self.model = model

    def forward(self, packed: Any, target: Any) -> Tuple[Optional[Tensor], Tensor]:
        data = packed.array if isinstance(packed, Tensor) else np.asarray(packed)
        if hasattr(data, "get") and not isinstance(data, np.ndarray):
            data = data.get()  # a device array: the split is host work
        n_num = self.model.config.n_numerical
        expected = self.model.config.n_features
        if data.ndim != 2 or data.shape[1] != expected:
            raise ValueError(f"the rows have {data.shape[1] if data.ndim == 2 else data.shape} "
                             f"columns, the model's config {expected} ({n_num} numerical, "
                             f"{expected - n_num} categorical)")
        x_num = data[:, :n_num].astype(np.float32)
        x_cat = data[:, n_num:].astype(np.int64)
        if isinstance(self.model, TabGPTForPreTraining):
            return None, self.model(x_num, x_cat).loss
        output = self.model(x_num, x_cat, labels=target)
        return output.logits, output.loss
