"""TabGPT with a head on its [CLS] token: classification (cross-entropy) and regression (MSE).

The head is the FT-Transformer's: the final LayerNorm of the backbone, ReLU, then one Linear
from the [CLS] token to ``num_labels`` outputs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from ... import functional as F
from ...core import Tensor
from ...nn import Linear
from .backbone import TabGPTModel
from .config import TabGPTConfig
from .pretrained import TabGPTPreTrainedModel

__all__ = ["TabGPTForRegression", "TabGPTForSequenceClassification", "TabGPTOutput"]


@dataclass
class TabGPTOutput:
    """``loss`` (given labels), ``logits`` (rows, num_labels) and the backbone's
    ``hidden_states`` (rows, 1 + columns, d_token)."""

    loss: Optional[Tensor] = None
    logits: Optional[Tensor] = None
    hidden_states: Optional[Tensor] = None


def _label_array(labels: Any) -> np.ndarray:
    data = labels.array if isinstance(labels, Tensor) else labels
    if hasattr(data, "get") and not isinstance(data, np.ndarray):
        data = data.get()
    return np.asarray(data)


class TabGPTForSequenceClassification(TabGPTPreTrainedModel):
    """A row's class scores; with ``config.problem_type == "regression"`` its values (as the
    sequence-classification models of other libraries, the one head serves both).

    ``forward(x_num, x_cat, labels=None)``: integer class ``labels`` (rows,) give the mean
    cross-entropy; float ``labels`` (rows,) or (rows, num_labels) give the mean squared error
    for regression.
    """

    def __init__(self, config: TabGPTConfig, dtype: Any = None) -> None:
        super().__init__()
        self.config = config
        self.tabgpt = TabGPTModel(config, dtype=dtype)
        self.classifier = Linear(config.d_token, config.num_labels, dtype=dtype)

    def forward(self, x_num: Any = None, x_cat: Any = None, labels: Any = None) -> TabGPTOutput:
        hidden = self.tabgpt(x_num, x_cat)
        logits = self.classifier(F.relu(hidden[:, 0]))
        loss = None if labels is None else self._loss(logits, _label_array(labels))
        return TabGPTOutput(loss=loss, logits=logits, hidden_states=hidden)

    def _loss(self, logits: Tensor, labels: np.ndarray) -> Tensor:
        rows, outputs = logits.shape
        if self.config.problem_type == "regression":
            if labels.dtype.kind not in "fiu" or labels.dtype == np.bool_:
                raise TypeError(f"regression labels must be numbers, got dtype {labels.dtype}")
            if labels.size != rows * outputs or labels.shape[0] != rows:
                raise ValueError(f"regression labels must have shape ({rows},) or ({rows}, "
                                 f"{outputs}) for logits {logits.shape}, got {labels.shape}")
            target = labels.reshape(rows, outputs).astype(logits.dtype)
            return F.mse_loss(logits, target)
        if labels.dtype.kind not in "iu":
            raise TypeError(f"classification labels must be integer class indices, got dtype "
                            f"{labels.dtype} (for regression set problem_type='regression')")
        if labels.shape != (rows,):
            raise ValueError(f"classification labels must have shape ({rows},), got "
                             f"{labels.shape}")
        if labels.size and (labels.min() < 0 or labels.max() >= outputs):
            raise ValueError(f"classification labels must be in [0, {outputs}), got values "
                             f"from {labels.min()} to {labels.max()}")
        return F.cross_entropy(logits, labels.astype(np.int64))


class TabGPTForRegression(TabGPTForSequenceClassification):
    """The same head for ``num_labels`` real-valued targets, trained with the mean squared
    error; ``problem_type`` must be ``"regression"``."""

    def __init__(self, config: TabGPTConfig, dtype: Any = None) -> None:
        if config.problem_type != "regression":
            raise ValueError(f"TabGPTForRegression needs problem_type='regression', got "
                             f"{config.problem_type!r}")
        super().__init__(config, dtype=dtype)
