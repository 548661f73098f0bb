"""Masked-cell pretraining: hide some cells of each row, predict them from the rest.

Each observed cell is masked with probability ``config.mask_probability``: its token is
replaced by the column's learned mask token, and the model predicts the hidden value from that
column's output token, a standardised number through a per-column linear map (squared error),
a category through a per-column classifier (cross-entropy). Missing cells are never targets.
The loss is the mean over all masked cells; ``numerical_loss`` and ``categorical_loss`` are the
means over the masked cells of each kind (zero when there are none).

With ``config.contrastive_weight > 0`` the SCARF view joins (``scarf.py``): each row and a
twin with some cells taken from other rows go through the backbone beside the masked rows (one
batch of three times the rows), and ``loss`` adds ``contrastive_weight`` times their InfoNCE
loss (``contrastive_loss``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

import numpy as np

from ... import functional as F
from ...core import Tensor, concatenate
from ...core.random import get_rng
from ...nn import Linear, ModuleList, Parameter
from ...nn._dtype import parameter_dtype
from .backbone import TabGPTModel
from .config import TabGPTConfig
from .pretrained import TabGPTPreTrainedModel
from .scarf import ScarfCorruption, ScarfProjection, corrupt_rows, info_nce_loss, \
    sample_corruption
from .tokenizer import token_init_

__all__ = ["TabGPTForPreTraining", "TabGPTPreTrainingOutput"]

_IGNORED = -100  # cross_entropy's ignore_index: cells that are not targets


@dataclass
class TabGPTPreTrainingOutput:
    loss: Tensor
    numerical_loss: Tensor
    categorical_loss: Tensor
    numerical_predictions: Optional[Tensor]  # (rows, n_numerical), standardised units
    categorical_logits: List[Tensor]  # one (rows, cardinality) per categorical column
    cell_mask: np.ndarray  # (rows, columns) bool: the cells that were hidden
    contrastive_loss: Optional[Tensor] = None  # SCARF's InfoNCE (contrastive_weight > 0)
    corruption: Optional[ScarfCorruption] = None  # the twins' replaced cells and sources


class TabGPTForPreTraining(TabGPTPreTrainedModel):
    """``forward(x_num, x_cat, cell_mask=None, corruption=None)``; without ``cell_mask`` (and,
    for the contrastive view, ``corruption``) they are drawn from the framework's generator
    (``neural_arch.core.manual_seed`` repeats them)."""

    def __init__(self, config: TabGPTConfig, dtype: Any = None) -> None:
        super().__init__()
        self.config = config
        dtype = parameter_dtype(dtype)
        d = config.d_token
        self.tabgpt = TabGPTModel(config, dtype=dtype)
        self.mask_tokens = Parameter(np.empty((config.n_features, d), dtype=dtype))
        token_init_(self.mask_tokens, d)
        if config.n_numerical:
            # column j's value is <token_j, weight_j> + bias_j
            self.numerical_decoder_weight = Parameter(np.empty((config.n_numerical, d),
                                                               dtype=dtype))
            token_init_(self.numerical_decoder_weight, d)
            self.numerical_decoder_bias = Parameter(np.zeros(config.n_numerical, dtype=dtype))
        else:
            self.register_parameter("numerical_decoder_weight", None)
            self.register_parameter("numerical_decoder_bias", None)
        self.categorical_decoders = ModuleList(Linear(d, cardinality, dtype=dtype)
                                               for cardinality in config.categorical_cardinalities)
        self.contrastive_projection = ScarfProjection(d, dtype=dtype) \
            if config.contrastive_weight else None

    def sample_cell_mask(self, rows: int) -> np.ndarray:
        return get_rng().random((rows, self.config.n_features)) < self.config.mask_probability

    def _checked_mask(self, cell_mask: Any, rows: int) -> np.ndarray:
        if cell_mask is None:
            return self.sample_cell_mask(rows)
        mask = np.asarray(cell_mask.array if isinstance(cell_mask, Tensor) else cell_mask)
        if mask.dtype != np.bool_:
            raise TypeError(f"cell_mask must be a bool array, got dtype {mask.dtype}")
        if mask.shape != (rows, self.config.n_features):
            raise ValueError(f"cell_mask must have shape ({rows}, {self.config.n_features}), "
                             f"got {mask.shape}")
        return mask

    def _checked_corruption(self, corruption: Any, rows: int) -> Optional[ScarfCorruption]:
        if self.contrastive_projection is None:
            if corruption is not None:
                raise ValueError("corruption= is given, but the contrastive view is off "
                                 "(config.contrastive_weight is 0)")
            return None
        if corruption is None:
            return sample_corruption(rows, self.config.n_features, self.config.corruption_rate,
                                     get_rng())
        if not isinstance(corruption, ScarfCorruption):
            raise TypeError(f"corruption must be a ScarfCorruption, got "
                            f"{type(corruption).__name__}")
        return corruption.check(rows, self.config.n_features)

    def forward(self, x_num: Any = None, x_cat: Any = None, cell_mask: Any = None,
                corruption: Any = None) -> TabGPTPreTrainingOutput:
        numbers, codes, missing = self.tabgpt.tokenizer.cells(x_num, x_cat)
        rows = missing.shape[0]
        mask = self._checked_mask(cell_mask, rows)
        corruption = self._checked_corruption(corruption, rows)
        if corruption is None:
            tokens = self.tabgpt.embed(x_num, x_cat)
        else:  # the rows and their twins, tokenized together
            twin_num, twin_cat = corrupt_rows(numbers, codes, corruption)
            both = self.tabgpt.embed(*(None if a is None else np.concatenate([a, b])
                                       for a, b in ((numbers, twin_num), (codes, twin_cat))))
            tokens = both[:rows]
        hidden_cells = mask[:, :, None].astype(tokens.dtype)
        masked = tokens * Tensor(1.0 - hidden_cells) + self.mask_tokens * Tensor(hidden_cells)
        contrastive_loss = None
        if corruption is None:
            hidden = self.tabgpt.encode(masked)
        else:  # one pass over the masked rows, the rows and the twins
            states = self.tabgpt.encode(concatenate([masked, both], axis=0))
            hidden = states[:rows]
            projected = self.contrastive_projection(states[rows:, 0])
            contrastive_loss = info_nce_loss(projected[:rows], projected[rows:],
                                             self.config.contrastive_temperature)
        targets = mask & ~missing
        n_num = self.config.n_numerical
        zero = Tensor(np.zeros((), dtype=tokens.dtype))
        numerical_sum, predictions = zero, None
        if n_num:
            predictions = (hidden[:, 1:1 + n_num] * self.numerical_decoder_weight).sum(-1) \
                + self.numerical_decoder_bias
            chosen = targets[:, :n_num]
            values = np.where(chosen, numbers, 0.0).astype(tokens.dtype)
            error = (predictions - Tensor(values)) * Tensor(chosen.astype(tokens.dtype))
            numerical_sum = (error * error).sum()
        categorical_sum, all_logits = zero, []
        for j, decoder in enumerate(self.categorical_decoders):
            column = n_num + j
            logits = decoder(hidden[:, 1 + column])
            wanted = np.where(targets[:, column], codes[:, j], _IGNORED)
            categorical_sum = categorical_sum + F.cross_entropy(logits, wanted, reduction="sum",
                                                                ignore_index=_IGNORED)
            all_logits.append(logits)
        n_numeric_targets = int(targets[:, :n_num].sum())
        n_category_targets = int(targets[:, n_num:].sum())
        loss = (numerical_sum + categorical_sum) * (
            1.0 / max(n_numeric_targets + n_category_targets, 1))
        if contrastive_loss is not None:
            loss = loss + contrastive_loss * self.config.contrastive_weight
        return TabGPTPreTrainingOutput(
            loss=loss,
            numerical_loss=numerical_sum * (1.0 / max(n_numeric_targets, 1)),
            categorical_loss=categorical_sum * (1.0 / max(n_category_targets, 1)),
            numerical_predictions=predictions, categorical_logits=all_logits, cell_mask=mask,
            contrastive_loss=contrastive_loss, corruption=corruption)
