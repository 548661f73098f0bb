"""Causal self-attention with its heads split across the tensor-parallel group.

The fused q | k | v projection is column-parallel by heads: rank r runs heads
``[r*H/t, (r+1)*H/t)``, its shard being those heads' rows of q, of k and of v (``Layout``
stride 3; a contiguous slice would give rank 0 all of q and nothing of k or v). Each rank
attends with its own heads, and the output projection is row-parallel over the same heads, so
the sub-block costs one all-reduce forward and one backward. Under sequence parallelism the
input is this rank's positions (all-gathered by ``c_attn``) and the output too (reduce-scattered
by ``c_proj``).

The attention weights of this rank's heads take their part of the dense weights' dropout mask
(``dropout.DenseDraws``): with dropout > 0 the parallel attention drops what the dense one does
under the same seed.
"""
from __future__ import annotations

from typing import Any, Optional

from ... import functional as F
from ...core.tensor import Tensor
from ...nn import CausalSelfAttention, Module
from ...nn._dtype import as_tensor
from ..group.world import ProcessGroup
from ._group import divide, group_rank_size
from .dropout import DenseDraws
from .layers import ColumnParallelLinear, RowParallelLinear

__all__ = ["ParallelCausalSelfAttention"]


class ParallelCausalSelfAttention(Module):
    """``CausalSelfAttention`` (same parameter names) running this rank's n_head/t heads,
    built from a dense one: ``c_attn`` and ``c_proj`` become this rank's shards of them,
    ``resid_dropout`` is kept as it is (a plan may make it sequence-parallel)."""

    def __init__(self, attention: CausalSelfAttention, group: Optional[ProcessGroup] = None, *,
                 sequence_input: bool = False, sequence_output: bool = False) -> None:
        super().__init__()
        if not isinstance(attention, CausalSelfAttention):
            raise TypeError(f"{type(self).__name__} is built from a CausalSelfAttention, got "
                            f"{type(attention).__name__}")
        rank, size = group_rank_size(group)
        self.local_heads = divide(type(self).__name__, "num_heads", attention.num_heads, size)
        self.embed_dim, self.num_heads = attention.embed_dim, attention.num_heads
        self.dropout = attention.dropout
        self.head_dim = self.embed_dim // self.num_heads
        self.c_attn = ColumnParallelLinear.from_dense(attention.c_attn, group=group, stride=3,
                                                      sequence_parallel=sequence_input)
        self.c_proj = RowParallelLinear.from_dense(attention.c_proj, group=group,
                                                   sequence_parallel=sequence_output)
        self.resid_dropout = attention.resid_dropout
        self.attn_draws = DenseDraws(-3, rank, size)
        self.train(attention.training)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        if x.ndim != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"{type(self).__name__} expects (batch, time, {self.embed_dim}), "
                             f"got {tuple(x.shape)}")
        heads = self.local_heads
        # this rank's [q | k | v], each (B, T, heads * D): the dense layout, fewer heads (and all
        # T positions, the input's being only T/t of them under sequence parallelism)
        qkv = self.c_attn(x)
        batch, time = qkv.shape[0], qkv.shape[1]
        qkv = qkv.reshape(batch, time, 3, heads, self.head_dim).permute(2, 0, 3, 1, 4)
        dropout_p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(qkv[0], qkv[1], qkv[2], causal=True,
                                           dropout_p=dropout_p, rng=self.attn_draws)
        y = y.transpose(1, 2).reshape(batch, time, heads * self.head_dim)
        return self.resid_dropout(self.c_proj(y))

    def extra_repr(self) -> str:
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads} ({self.local_heads} " \
               f"here), dropout={self.dropout}"
