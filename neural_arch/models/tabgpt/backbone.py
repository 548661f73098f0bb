"""``TabGPTModel``: feature tokens behind a [CLS] token, through pre-norm transformer blocks.

The FT-Transformer's backbone: the first block has no attention LayerNorm (its input is the
tokenizer's output, already on a sensible scale), every other sub-layer is
``x + dropout(sublayer(norm(x)))``, and a final LayerNorm closes the stack. There is no position
embedding: a column is told apart by its own tokenizer weights, not by where it sits.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from ... import functional as F
from ...core import Tensor, concatenate, is_grad_enabled
from ...nn import Dropout, Identity, LayerNorm, Linear, Module, ModuleList, MultiheadAttention
from ...nn import Parameter
from ...nn._dtype import parameter_dtype
from ...utils.checkpoint import checkpoint
from .config import TabGPTConfig
from .pretrained import TabGPTPreTrainedModel
from .tokenizer import FeatureTokenizer, token_init_

__all__ = ["TabGPTBlock", "TabGPTFeedForward", "TabGPTModel"]


class TabGPTFeedForward(Module):
    """Linear -> activation -> dropout -> Linear; ReGLU's first Linear is twice as wide and
    its halves multiply as ``a * relu(b)``."""

    def __init__(self, config: TabGPTConfig, dtype: Any = None) -> None:
        super().__init__()
        self.activation = config.activation
        hidden = config.d_ffn
        widen = 2 if config.activation == "reglu" else 1
        self.linear_first = Linear(config.d_token, widen * hidden, dtype=dtype)
        self.dropout = Dropout(config.ffn_dropout)
        self.linear_second = Linear(hidden, config.d_token, dtype=dtype)
        self.hidden = hidden

    def forward(self, x: Tensor) -> Tensor:
        h = self.linear_first(x)
        if self.activation == "reglu":
            h = h[..., :self.hidden] * F.relu(h[..., self.hidden:])
        elif self.activation == "gelu":
            h = F.gelu(h)
        else:
            h = F.relu(h)
        return self.linear_second(self.dropout(h))


class TabGPTBlock(Module):
    """``x + drop(attn(norm(x)))`` then ``x + drop(ffn(norm(x)))``; block 0 skips the first
    norm."""

    def __init__(self, config: TabGPTConfig, index: int, dtype: Any = None) -> None:
        super().__init__()
        d = config.d_token
        self.attention_norm = Identity() if index == 0 else \
            LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.attention = MultiheadAttention(d, config.n_heads, dropout=config.attention_dropout,
                                            batch_first=True, dtype=dtype)
        self.ffn_norm = LayerNorm(d, eps=config.layer_norm_eps, dtype=dtype)
        self.ffn = TabGPTFeedForward(config, dtype=dtype)
        self.residual_dropout = Dropout(config.residual_dropout)

    def forward(self, x: Tensor) -> Tensor:
        h = self.attention_norm(x)
        attended, _ = self.attention(h, h, h, need_weights=False)
        x = x + self.residual_dropout(attended)
        return x + self.residual_dropout(self.ffn(self.ffn_norm(x)))


class TabGPTModel(TabGPTPreTrainedModel):
    """Rows in, (rows, 1 + columns, d_token) hidden states out; position 0 is [CLS].

    ``forward(x_num, x_cat)``: ``x_num`` (rows, n_numerical) numbers with NaN for a missing
    cell, ``x_cat`` (rows, n_categorical) integer codes with -1 for a missing one (as
    ``neural_arch.data.tabular.TabularPreprocessor`` writes them). ``embed`` and ``encode`` are
    the two halves, for callers that change tokens in between (masked-cell pretraining).
    """

    def __init__(self, config: TabGPTConfig, dtype: Any = None) -> None:
        super().__init__()
        if not isinstance(config, TabGPTConfig):
            raise TypeError(f"TabGPTModel expects a TabGPTConfig, got {type(config).__name__}")
        self.config = config
        dtype = parameter_dtype(dtype)
        self.tokenizer = FeatureTokenizer(config.n_numerical, config.categorical_cardinalities,
                                          config.d_token, dtype=dtype)
        self.cls_token = Parameter(np.empty((1, 1, config.d_token), dtype=dtype))
        token_init_(self.cls_token, config.d_token)
        self.blocks = ModuleList(TabGPTBlock(config, i, dtype=dtype)
                                 for i in range(config.n_layers))
        self.final_norm = LayerNorm(config.d_token, eps=config.layer_norm_eps, dtype=dtype)

    def embed(self, x_num: Any = None, x_cat: Any = None) -> Tensor:
        """The (rows, columns, d_token) feature tokens, without [CLS]."""
        return self.tokenizer(x_num, x_cat)

    def encode(self, tokens: Tensor) -> Tensor:
        """[CLS] + ``tokens`` through the blocks and the final norm."""
        rows = tokens.shape[0]
        cls = self.cls_token.expand(rows, 1, self.config.d_token)
        x = concatenate([cls, tokens], axis=1)
        recompute = self.config.gradient_checkpointing and self.training and is_grad_enabled()
        last = len(self.blocks) - 1
        for i, block in enumerate(self.blocks):
            # the last block keeps its activations: backward would recompute it at once
            x = checkpoint(block, x) if recompute and i < last else block(x)
        return self.final_norm(x)

    def forward(self, x_num: Any = None, x_cat: Any = None) -> Tensor:
        return self.encode(self.embed(x_num, x_cat))
