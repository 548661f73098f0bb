"""The SCARF contrastive view of pretraining (Bahri et al., 2021, "SCARF: Self-Supervised
Contrastive Learning using Random Feature Corruption").

Each row gets a corrupted twin: a random subset of ``floor(corruption_rate x columns)`` of its
cells (at least one) takes the value of the same column in another random row of the batch,
that is a draw from the column's empirical marginal (a missing cell stays missing: absence is
part of the marginal). The original row and its twin go through the backbone; their [CLS]
states through a projection head (Linear, ReLU, Linear); and the InfoNCE loss asks each row's
projection to be closer, in cosine similarity over ``temperature``, to its own twin's than to
the other rows' twins. ``TabGPTForPreTraining`` adds it to the masked-cell loss with the weight
``config.contrastive_weight``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Tuple

import numpy as np

from ... import functional as F
from ...core import Tensor
from ...nn import Linear, Module

__all__ = ["ScarfCorruption", "ScarfProjection", "corrupt_rows", "info_nce_loss",
           "sample_corruption"]


@dataclass
class ScarfCorruption:
    """Which cells of each row were replaced, and from which row each cell's value comes."""

    replaced: np.ndarray  # (rows, columns) bool
    source_rows: np.ndarray  # (rows, columns) int64: the row itself where not replaced

    def check(self, rows: int, columns: int) -> "ScarfCorruption":
        replaced, source = np.asarray(self.replaced), np.asarray(self.source_rows)
        if replaced.dtype != np.bool_ or replaced.shape != (rows, columns):
            raise ValueError(f"corruption.replaced must be a bool array of shape ({rows}, "
                             f"{columns}), got {replaced.dtype} {replaced.shape}")
        if source.dtype.kind not in "iu" or source.shape != (rows, columns):
            raise ValueError(f"corruption.source_rows must be an integer array of shape "
                             f"({rows}, {columns}), got {source.dtype} {source.shape}")
        if source.size and (source.min() < 0 or source.max() >= rows):
            raise ValueError(f"corruption.source_rows must be row numbers in [0, {rows}), got "
                             f"values from {source.min()} to {source.max()}")
        own = np.broadcast_to(np.arange(rows)[:, None], (rows, columns))
        if (source[~replaced] != own[~replaced]).any():
            raise ValueError("corruption.source_rows must name the row itself for every cell "
                             "that is not replaced")
        return ScarfCorruption(replaced, source.astype(np.int64, copy=False))


def sample_corruption(rows: int, columns: int, rate: float,
                      rng: np.random.Generator) -> ScarfCorruption:
    """``floor(rate x columns)`` cells (at least one) of each row, chosen uniformly, each to be
    replaced by the same column of another row drawn uniformly (itself when ``rows`` is 1)."""
    count = min(columns, max(1, int(rate * columns)))
    chosen = np.argsort(rng.random((rows, columns)), axis=1)[:, :count]
    replaced = np.zeros((rows, columns), dtype=bool)
    replaced[np.arange(rows)[:, None], chosen] = True
    own = np.arange(rows, dtype=np.int64)[:, None]
    # an offset in [1, rows) never lands on the row itself
    offset = rng.integers(1, rows, (rows, columns)) if rows > 1 else np.zeros((rows, columns),
                                                                              dtype=np.int64)
    source = np.where(replaced, (own + offset) % max(rows, 1), own)
    return ScarfCorruption(replaced, source.astype(np.int64))


def corrupt_rows(x_num: Optional[np.ndarray], x_cat: Optional[np.ndarray],
                 corruption: ScarfCorruption) -> Tuple[Optional[np.ndarray], Optional[np.ndarray]]:
    """The corrupted twins of the rows: cell (i, j) is cell (source_rows[i, j], j)."""
    n_num = 0 if x_num is None else x_num.shape[1]
    twins = []
    for offset, values in ((0, x_num), (n_num, x_cat)):
        if values is None:
            twins.append(None)
            continue
        width = values.shape[1]
        sources = corruption.source_rows[:, offset:offset + width]
        twins.append(values[sources, np.arange(width)])
    return twins[0], twins[1]


def info_nce_loss(anchors: Tensor, positives: Tensor, temperature: float) -> Tensor:
    """Mean over rows i of ``-log softmax_k(cos(a_i, p_k) / temperature)[i]``."""
    def unit(x: Tensor) -> Tensor:
        return x / (x * x).sum(-1, keepdims=True).sqrt()
    similarity = unit(anchors) @ unit(positives).T
    return F.cross_entropy(similarity * (1.0 / temperature), np.arange(anchors.shape[0]))


class ScarfProjection(Module):
    """SCARF's pretraining head on the [CLS] state: Linear, ReLU, Linear (d_token wide)."""

    def __init__(self, d_token: int, dtype: Any = None) -> None:
        super().__init__()
        self.dense = Linear(d_token, d_token, dtype=dtype)
        self.output = Linear(d_token, d_token, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.output(F.relu(self.dense(x)))
