"""The model behind the endpoint: a ``save_pretrained`` folder loaded for prediction, and its
rows run through a ``BatchingWorker`` (the ``DynamicBatcher`` on a thread of its own).

``load_servable(folder)`` reads the class from ``config.json`` and the preprocessor from
``preprocessor.json``; a folder that is not one, or holds a model without a prediction head,
is a ``ModelFolderError`` (the command's exit status 2). ``TabularPredictor`` encodes a table
with the training statistics, submits it in pieces of at most ``max_batch_size`` rows (a piece
is never split further, so each caller's rows stay together in a batch) and turns the model's
scores into the answer: class labels with their probabilities, or values in the target's units.
"""
from __future__ import annotations

import json
import os
import time
from concurrent.futures import Future
from typing import Any, Dict, List, Tuple

import numpy as np

from ..core import no_grad
from ..data.tabular import TabularPreprocessor
from ..models.tabgpt import TabGPTForRegression, TabGPTForSequenceClassification
from ..models.tabgpt.pretrained import CONFIG_NAME
from ..tabgpt.serving import BatchingWorker, DynamicBatcher, PaddedBatch
from .latency import LatencyRecord

__all__ = ["ModelFolderError", "TabularPredictor", "load_servable"]

_RECENT = 100_000  # pieces (and batches) whose times GET /health summarises
_SERVABLE = {cls.__name__: cls for cls in (TabGPTForSequenceClassification, TabGPTForRegression)}


class ModelFolderError(ValueError):
    """The model folder cannot be served; the message says why in one line."""


def _architecture(folder: str) -> str:
    path = os.path.join(folder, CONFIG_NAME)
    try:
        with open(path, encoding="utf-8") as handle:
            names = json.load(handle).get("architectures") or []
    except (OSError, ValueError, AttributeError) as exc:
        raise ModelFolderError(f"cannot read {path}: {exc}") from None
    if not names:
        raise ModelFolderError(f"{path} names no architecture (a folder written by "
                               f"save_pretrained lists the class that wrote it)")
    if names[0] not in _SERVABLE:
        raise ModelFolderError(f"{folder!r} holds a {names[0]}, which has no prediction head; "
                               f"serve a folder of one of {sorted(_SERVABLE)} (fine-tune it "
                               f"first)")
    return names[0]


def load_servable(folder: Any) -> Tuple[Any, TabularPreprocessor]:
    """The model saved in ``folder`` (in eval mode) and its fitted preprocessor."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ModelFolderError(f"model folder {folder!r} does not exist or is not a folder "
                               f"(pass a folder written by save_pretrained)")
    cls = _SERVABLE[_architecture(folder)]
    try:
        model = cls.from_pretrained(folder)
        preprocessor = TabularPreprocessor.from_pretrained(folder)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ModelFolderError(f"cannot load {folder!r}: {exc}") from None
    config = model.config
    if preprocessor.task is None:
        raise ModelFolderError(f"{folder!r}: the preprocessor was fitted without a target, so "
                               f"predictions cannot be put in the target's units")
    wanted = "regression" if config.problem_type == "regression" else "classification"
    shape = (preprocessor.n_numerical, preprocessor.categorical_cardinalities)
    if preprocessor.task != wanted or shape != (config.n_numerical,
                                                config.categorical_cardinalities):
        raise ModelFolderError(f"{folder!r}: the preprocessor ({preprocessor.task}, columns "
                               f"{shape}) does not fit the model ({config.problem_type}, "
                               f"columns {(config.n_numerical, config.categorical_cardinalities)})")
    model.eval()
    return model, preprocessor


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


class TabularPredictor:
    def __init__(self, model: Any, preprocessor: TabularPreprocessor, max_batch_size: int = 64,
                 timeout_ms: float = 5.0) -> None:
        self.model, self.preprocessor = model, preprocessor
        self.numerical = list(preprocessor.numerical_columns)
        self.categorical = list(preprocessor.categorical_columns)
        self.regression = preprocessor.task == "regression"
        self.dtype = next(iter(model.parameters())).array.dtype
        self.max_batch_size, self.timeout_ms = max_batch_size, timeout_ms
        self.in_batcher = LatencyRecord(keep=_RECENT)  # per piece: queued, batched, run
        self.model_calls = LatencyRecord(keep=_RECENT)  # per batch: the model's call alone
        self.worker = BatchingWorker(self._forward, DynamicBatcher(
            max_batch_size=max_batch_size, timeout_ms=timeout_ms, padding_strategy="do_not_pad"))

    def _forward(self, batch: PaddedBatch) -> np.ndarray:
        started = time.monotonic()
        scores = self._scores(batch.data)
        self.model_calls.add(time.monotonic() - started)
        return scores

    def _scores(self, packed: np.ndarray) -> np.ndarray:
        """The model's scores (rows, num_labels) for packed rows (``encode``)."""
        n_num = len(self.numerical)
        with no_grad():
            logits = self.model(packed[:, :n_num].astype(self.dtype),
                                packed[:, n_num:].astype(np.int64)).logits
        return np.asarray(logits.numpy(), dtype=np.float64)

    def warm_up(self) -> None:
        """One model call on a row of column means and first categories: the first call of a
        fresh process is slow (the framework's lazy set-up), and no request should pay it."""
        self._scores(np.zeros((1, len(self.numerical) + len(self.categorical))))

    def encode(self, table: Dict[str, np.ndarray]) -> np.ndarray:
        """One array per request: the standardised numbers, then the category codes (exact as
        float64), so the batcher moves a request's rows as one."""
        encoded = self.preprocessor.transform(table)
        if np.isinf(encoded.x_num).any():  # finite in JSON, out of float32's range once scaled
            row, column = map(int, np.argwhere(np.isinf(encoded.x_num))[0])
            name = self.numerical[column]
            raise ValueError(f"row {row}, column {name!r}: {float(table[name][row])!r} is out of range "
                             f"for the model")
        return np.concatenate([encoded.x_num.astype(np.float64),
                               encoded.x_cat.astype(np.float64)], axis=1)

    def submit(self, packed: np.ndarray) -> List[Future]:
        """Futures of the request's scores, one per piece of at most ``max_batch_size`` rows;
        each piece's time in the batcher (queued, batched, run) is recorded."""
        futures = []
        for start in range(0, len(packed), self.max_batch_size):
            submitted = time.monotonic()
            future = self.worker.submit(packed[start:start + self.max_batch_size])
            # runs on the batching thread as the result is set: the batcher's own latency,
            # without the HTTP and event-loop time around it
            future.add_done_callback(
                lambda _, since=submitted: self.in_batcher.add(time.monotonic() - since))
            futures.append(future)
        return futures

    def answer(self, logits: np.ndarray) -> Dict[str, Any]:
        """The response body for the scores of a request's rows, in order."""
        if not np.isfinite(logits).all():
            raise RuntimeError("the model produced non-finite scores for these rows")
        if self.regression:
            return {"predictions": self.preprocessor.decode_target(logits[:, 0]).tolist()}
        labels = self.preprocessor.decode_target(logits.argmax(axis=1))
        return {"predictions": [str(label) for label in labels],
                "probabilities": _softmax(logits).tolist(),
                "classes": [str(label) for label in self.preprocessor.target_labels]}

    def describe(self, pieces_since: int = 0, batches_since: int = 0) -> Dict[str, Any]:
        """What ``GET /health`` answers: the model, its columns in the order list rows use, and
        the times (ms) of the pieces and batches recorded after the first ``pieces_since`` and
        ``batches_since``: in the batcher (queued, batched, run) and the model's calls."""
        return {"status": "ok", "model": type(self.model).__name__,
                "task": self.preprocessor.task, "numerical": self.numerical,
                "categorical": self.categorical, "columns": self.numerical + self.categorical,
                "max_batch_size": self.max_batch_size, "timeout_ms": self.timeout_ms,
                "batches_run": self.worker.batches_run,
                "pending_rows": self.worker.batcher.pending_rows(),
                "batcher_latency_ms": self.in_batcher.summary_ms(pieces_since),
                "model_call_ms": self.model_calls.summary_ms(batches_since)}

    def close(self) -> None:
        self.worker.close()
