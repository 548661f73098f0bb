"""Multi-head attention: nanoGPT's ``CausalSelfAttention`` and PyTorch's ``MultiheadAttention``."""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

import numpy as np

from .. import functional as F
from ..backends import xp_of
from ..core import Tensor
from . import init
from ._dtype import as_tensor, parameter_dtype
from .dropout import Dropout
from .linear import Linear
from .module import Module
from .parameter import Parameter


def _check_heads(embed_dim: int, num_heads: int) -> None:
    if num_heads < 1 or embed_dim % num_heads != 0:
        raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads ({num_heads})")


def _causal_mask(xp: Any, rows: int, cols: int) -> Any:
    """True above the diagonal: the future positions a query may not see."""
    return xp.triu(xp.ones((rows, cols), dtype=bool), k=1)


def _attend(q: Tensor, k: Tensor, v: Tensor, mask: Any, additive: Any, dropout: Dropout
            ) -> Tuple[Tensor, Tensor]:
    """softmax(q k^T / sqrt(d) [+ additive] [masked]) v, with dropout on the weights."""
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(q.shape[-1]))
    if additive is not None:
        scores = scores + additive
    if mask is not None:
        scores = scores.masked_fill(mask, -np.inf)
    weights = F.softmax(scores, -1)
    return dropout(weights) @ v, weights


class CausalSelfAttention(Module):
    """nanoGPT's attention block: one fused ``c_attn`` Linear (embed -> 3 * embed) for q, k, v,
    causal multi-head attention, then the ``c_proj`` output Linear and residual dropout.

    Input and output are (batch, time, embed_dim).
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _check_heads(embed_dim, num_heads)
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.dropout = float(dropout)
        self.c_attn = Linear(embed_dim, 3 * embed_dim, bias=bias, device=device, dtype=dtype)
        self.c_proj = Linear(embed_dim, embed_dim, bias=bias, device=device, dtype=dtype)
        self.resid_dropout = Dropout(dropout)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"CausalSelfAttention expects (batch, time, {self.embed_dim}), got "
                             f"{tuple(x.shape)}")
        batch, time, embed = x.shape
        heads, head_dim = self.num_heads, embed // self.num_heads
        # (B, T, 3C) -> (3, B, H, T, D): one reshape and one permute for q, k and v together.
        qkv = self.c_attn(x).reshape(batch, time, 3, heads, head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, causal=True, dropout_p=dropout_p)
        y = y.transpose(1, 2).reshape(batch, time, embed)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}"


class MultiheadAttention(Module):
    """``torch.nn.MultiheadAttention``: separate query/key/value inputs, packed ``in_proj``
    weights (3E, E), ``out_proj`` Linear; returns ``(output, weights)``.

    Inputs are (L, N, E) unless ``batch_first``. ``attn_mask`` (L, S) or (N*H, L, S) is a bool
    mask (True = not allowed) or an additive float mask; ``key_padding_mask`` (N, S) is True
    for keys to ignore; ``is_causal`` masks future positions. Weights are averaged over heads
    unless ``average_attn_weights=False``.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 batch_first: bool = False, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        _check_heads(embed_dim, num_heads)
        self.embed_dim, self.num_heads = int(embed_dim), int(num_heads)
        self.head_dim, self.batch_first = embed_dim // num_heads, batch_first
        self.dropout = float(dropout)
        dtype = parameter_dtype(dtype)
        self.in_proj_weight = Parameter(np.empty((3 * embed_dim, embed_dim), dtype=dtype))
        if bias:
            self.in_proj_bias = Parameter(np.zeros(3 * embed_dim, dtype=dtype))
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = Linear(embed_dim, embed_dim, bias=bias, dtype=dtype)
        self.attn_dropout = Dropout(dropout)
        init.xavier_uniform_(self.in_proj_weight)
        if bias:
            init.zeros_(self.out_proj.bias)
        if device is not None:
            self.to(device)

    def _project(self, x: Any, part: int) -> Tensor:
        rows = slice(part * self.embed_dim, (part + 1) * self.embed_dim)
        bias = None if self.in_proj_bias is None else self.in_proj_bias[rows]
        out = F.linear(x, self.in_proj_weight[rows], bias)
        batch, length = out.shape[0], out.shape[1]
        return out.reshape(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _masks(self, xp: Any, batch: int, length: int, source: int, attn_mask: Any,
               key_padding_mask: Any, is_causal: bool) -> Tuple[Any, Any]:
        boolean, additive = None, None
        if is_causal:
            boolean = _causal_mask(xp, length, source)
        if attn_mask is not None:
            mask = attn_mask.array if isinstance(attn_mask, Tensor) else xp.asarray(attn_mask)
            if mask.ndim == 3:
                mask = mask.reshape(batch, self.num_heads, length, source)
            if mask.dtype == bool:
                boolean = mask if boolean is None else (boolean | mask)
            else:
                additive = mask
        if key_padding_mask is not None:
            padding = key_padding_mask.array if isinstance(key_padding_mask, Tensor) \
                else xp.asarray(key_padding_mask)
            if padding.shape != (batch, source):
                raise ValueError(f"key_padding_mask must have shape {(batch, source)}, got "
                                 f"{tuple(padding.shape)}")
            padding = padding[:, None, None, :]
            if padding.dtype == bool:
                boolean = padding if boolean is None else (boolean | padding)
            else:
                additive = padding if additive is None else additive + padding
        return boolean, additive

    def forward(self, query: Any, key: Any, value: Any, key_padding_mask: Any = None,
                need_weights: bool = True, attn_mask: Any = None,
                average_attn_weights: bool = True, is_causal: bool = False
                ) -> Tuple[Tensor, Optional[Tensor]]:
        if query.shape[-1] != self.embed_dim:
            raise ValueError(f"MultiheadAttention expects embed_dim {self.embed_dim}, got query "
                             f"of shape {tuple(query.shape)}")
        query, key, value = (as_tensor(t) for t in (query, key, value))
        if not self.batch_first:
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        batch, length, source = query.shape[0], query.shape[1], key.shape[1]
        q, k, v = self._project(query, 0), self._project(key, 1), self._project(value, 2)
        boolean, additive = self._masks(xp_of(q.array), batch, length, source, attn_mask,
                                        key_padding_mask, is_causal)
        y, weights = _attend(q, k, v, boolean, additive, self.attn_dropout)
        y = self.out_proj(y.transpose(1, 2).reshape(batch, length, self.embed_dim))
        if not self.batch_first:
            y = y.transpose(0, 1)
        if not need_weights:
            return y, None
        return y, (weights.mean(axis=1) if average_attn_weights else weights)

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, " \
               f"batch_first={self.batch_first}"
