"""``TabularPredictionService``: a trained TabGPT behind a ``DynamicBatcher``.

``predict(rows)`` takes rows of the raw table (a dict of columns, or a list of dicts, one per
row), encodes them with the preprocessor the model was trained with, and waits for its batch:
rows of concurrent callers are run together, up to ``max_batch_size`` rows or ``timeout_ms``.
It returns one prediction per row in the target's units (class labels, or values for
regression). Every row of a table has all columns, so batches need no padding.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence, Union

import numpy as np

from ...core import no_grad
from ...data.tabular import TabularPreprocessor
from .batcher import DynamicBatcher, PaddedBatch
from .worker import BatchingWorker

__all__ = ["TabularPredictionService"]


def _columns(rows: Union[Dict[str, Any], Sequence[Dict[str, Any]]]) -> Dict[str, np.ndarray]:
    if isinstance(rows, dict):
        return {name: np.asarray(values) for name, values in rows.items()}
    rows = list(rows)
    if not rows or not all(isinstance(r, dict) for r in rows):
        raise ValueError("predict: rows must be a dict of columns or a non-empty list of "
                         "dicts (one per row)")
    names = list(rows[0])
    for i, row in enumerate(rows):
        if set(row) != set(names):
            raise ValueError(f"predict: row {i} has columns {sorted(row)}, row 0 {sorted(names)}")
    return {name: np.asarray([row[name] for row in rows]) for name in names}


class TabularPredictionService:
    def __init__(self, model: Any, preprocessor: TabularPreprocessor, max_batch_size: int = 64,
                 timeout_ms: float = 5.0) -> None:
        if not preprocessor.fitted:
            raise RuntimeError("TabularPredictionService: the preprocessor is not fitted")
        self.model, self.preprocessor = model, preprocessor
        self.model.eval()
        self.worker = BatchingWorker(self._run, DynamicBatcher(
            max_batch_size=max_batch_size, timeout_ms=timeout_ms, padding_strategy="do_not_pad"))

    def _run(self, batch: PaddedBatch) -> np.ndarray:
        n_num = self.model.config.n_numerical
        with no_grad():
            logits = self.model(batch.data[:, :n_num].astype(np.float32),
                                batch.data[:, n_num:].astype(np.int64)).logits.numpy()
        if self.preprocessor.task == "regression":
            return self.preprocessor.decode_target(logits[:, 0])
        return self.preprocessor.decode_target(logits.argmax(axis=1))

    def predict(self, rows: Any, timeout: float = 30.0) -> List[Any]:
        encoded = self.preprocessor.transform(_columns(rows))
        packed = np.concatenate([encoded.x_num.astype(np.float64),
                                 encoded.x_cat.astype(np.float64)], axis=1)
        return list(self.worker.predict(packed, timeout=timeout))

    def close(self) -> None:
        self.worker.close()

    def __enter__(self) -> "TabularPredictionService":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
