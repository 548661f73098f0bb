"""The GPT's blocks split Megatron-style across a tensor-parallel group.

Attention: the fused q | k | v projection is column-parallel by heads (rank r runs heads
``[r*H/t, (r+1)*H/t)``: its shard is those heads' rows of q, of k and of v, ``Layout`` stride
3), each rank attends with its own heads, and the output projection is row-parallel over the
same heads. MLP: ``c_fc`` column-parallel, ``c_proj`` row-parallel. Each sub-block thus costs
one all-reduce forward (after its row-parallel projection) and one backward (the gradient of
its input, in the column-parallel layer's ``copy_to_tensor_parallel_region``).

What lies between the sub-blocks (residual stream, LayerNorms, position embeddings, dropout
on the residual) is replicated: every rank computes it whole, on the same values, so its
gradients are identical on every rank without any communication. The token embedding is
vocabulary-parallel, and the LM head, tied to it, gives each rank the logits of its own
vocabulary entries, which ``vocab_parallel_cross_entropy`` turns into the loss without ever
gathering them.

With ``sequence_parallel`` the replicated part runs on this rank's time/t positions instead
(``sequence``): each all-reduce becomes a reduce-scatter forward and an all-gather backward,
the all-gather before each column-parallel layer a reduce-scatter backward.

``build_tensor_parallel(gpt, config, group)`` fills a ``GPT`` being constructed: the module
names are those of the dense GPT, so its ``state_dict()`` has the dense keys (each rank's
shapes) and ``sharding`` maps it to and from the dense state. It initialises as the dense GPT
does, drawing every parameter whole from the global generator in the dense model's order and
keeping this rank's shard: under the same seed the parallel model is the sharded dense one.

Dropout draws the dense model's masks too (``dropout``): on the replicated residual stream
every rank draws the same dense mask, and on the attention weights of its heads (and under
sequence parallelism on its positions) each rank keeps its part of the dense mask. With
dropout > 0, then, the parallel GPT still trains as the dense GPT under the same seed.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import numpy as np

from ... import functional as F
from ...core.random import get_rng
from ...core.tensor import Tensor
from ...nn import GELU, Dropout, Embedding, LayerNorm, Linear, Module, ModuleList, init
from ...nn._dtype import as_tensor
from ..group.world import ProcessGroup
from ._group import divide, group_rank_size
from .cross_entropy import vocab_parallel_cross_entropy
from .dropout import DenseDraws, PartDropout
from .mappings import gather_from_tensor_parallel_region
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding, _Sharded
from .sequence import SequenceParallelLayerNorm, SequenceParallelPositionEmbedding

__all__ = ["ParallelCausalSelfAttention", "ParallelFeedForward", "ParallelBlock",
           "build_tensor_parallel", "next_token_logits", "tensor_parallel_loss"]


class ParallelCausalSelfAttention(Module):
    """``CausalSelfAttention`` with this rank's n_head/t heads (same parameter names)."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 group: Optional[ProcessGroup] = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        _, size = group_rank_size(group)
        if num_heads < 1 or embed_dim % num_heads:
            raise ValueError(f"embed_dim ({embed_dim}) must be divisible by num_heads "
                             f"({num_heads})")
        self.local_heads = divide(type(self).__name__, "num_heads", num_heads, size)
        self.embed_dim, self.num_heads, self.dropout = embed_dim, num_heads, float(dropout)
        self.head_dim = embed_dim // num_heads
        self.c_attn = ColumnParallelLinear(embed_dim, 3 * embed_dim, bias=bias, group=group,
                                           stride=3, sequence_parallel=sequence_parallel)
        self.c_proj = RowParallelLinear(embed_dim, embed_dim, bias=bias, group=group,
                                        sequence_parallel=sequence_parallel)
        self.resid_dropout = _residual_dropout(dropout, group, sequence_parallel)
        # the attention weights of this rank's heads take the dense weights' mask there
        self.attn_draws = DenseDraws(-3, *group_rank_size(group))

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


class ParallelFeedForward(Module):
    """Column-parallel Linear(C, 4C) -> GELU -> row-parallel Linear(4C, C) -> Dropout."""

    def __init__(self, n_embd: int, dropout: float, bias: bool,
                 group: Optional[ProcessGroup] = None, sequence_parallel: bool = False) -> None:
        super().__init__()
        self.c_fc = ColumnParallelLinear(n_embd, 4 * n_embd, bias=bias, group=group,
                                         sequence_parallel=sequence_parallel)
        self.gelu = GELU()
        self.c_proj = RowParallelLinear(4 * n_embd, n_embd, bias=bias, group=group,
                                        sequence_parallel=sequence_parallel)
        self.dropout = _residual_dropout(dropout, group, sequence_parallel)

    def forward(self, x: Tensor) -> Tensor:
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class ParallelBlock(Module):
    """The dense ``Block`` with parallel attention and MLP; the LayerNorms are replicated (and
    run on this rank's positions under sequence parallelism)."""

    def __init__(self, config: Any, group: Optional[ProcessGroup] = None,
                 sequence_parallel: bool = False) -> None:
        super().__init__()
        sp = sequence_parallel
        self.ln_1 = _layer_norm(config.n_embd, group, sp)
        self.attn = ParallelCausalSelfAttention(config.n_embd, config.n_head, config.dropout,
                                                config.bias, group, sp)
        self.ln_2 = _layer_norm(config.n_embd, group, sp)
        self.mlp = ParallelFeedForward(config.n_embd, config.dropout, config.bias, group, sp)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


def _residual_dropout(p: float, group: Optional[ProcessGroup], sequence_parallel: bool
                      ) -> Module:
    """Dropout on the residual stream: replicated (every rank draws the same dense mask), or
    under sequence parallelism this rank's positions of the dense mask."""
    return PartDropout(p, group, dim=-2) if sequence_parallel else Dropout(p)


def _layer_norm(n_embd: int, group: Optional[ProcessGroup], sequence_parallel: bool) -> Module:
    return SequenceParallelLayerNorm(n_embd, group) if sequence_parallel else LayerNorm(n_embd)


def _check_config(config: Any, size: int, sequence_parallel: bool) -> None:
    sizes = [("n_head", config.n_head), ("vocab_size", config.vocab_size),
             ("4 * n_embd", 4 * config.n_embd)]
    if sequence_parallel:  # a full context (generate's) must split over the ranks
        sizes.append(("block_size (sequence parallel)", config.block_size))
    for what, value in sizes:
        if value % size:
            raise ValueError(f"GPT: {what} ({value}) is not divisible by the tensor-parallel "
                             f"size {size}")


def build_tensor_parallel(gpt: Module, config: Any, group: ProcessGroup,
                          sequence_parallel: bool = False) -> None:
    """Give ``gpt`` (a ``GPT`` in its constructor) the tensor-parallel modules and weights;
    with ``sequence_parallel`` the residual stream between the sub-blocks holds only this
    rank's positions (``sequence``), from the embeddings to the final LayerNorm."""
    _, size = group_rank_size(group)
    _check_config(config, size, sequence_parallel)
    if config.n_embd % config.n_head:
        raise ValueError(f"n_embd ({config.n_embd}) must be divisible by n_head "
                         f"({config.n_head})")
    sp = bool(sequence_parallel)
    gpt.wte = VocabParallelEmbedding(config.vocab_size, config.n_embd, group,
                                     sequence_parallel=sp)
    gpt.wpe = SequenceParallelPositionEmbedding(config.block_size, config.n_embd, group) if sp \
        else Embedding(config.block_size, config.n_embd)
    gpt.drop = _residual_dropout(config.dropout, group, sp)
    gpt.h = ModuleList(ParallelBlock(config, group, sp) for _ in range(config.n_layer))
    gpt.ln_f = _layer_norm(config.n_embd, group, sp)
    # the LM head gives this rank the logits of its vocabulary rows (those of its wte shard),
    # for every position (under sequence parallelism it gathers them first)
    gpt.lm_head = ColumnParallelLinear(config.n_embd, config.vocab_size, bias=False,
                                       group=group, sequence_parallel=sp)
    if config.tie_weights:
        gpt.lm_head.weight = gpt.wte.weight
    _init_weights(gpt, config)


def _normal_shard(module: Module, name: str, std: float) -> None:
    """Draw parameter ``name`` whole from N(0, std) as the dense model would; keep the shard."""
    param = getattr(module, name)
    layout = module.tp_layout[name]
    dense = get_rng().normal(0.0, std, size=layout.dense_shape(param.shape, module.tp_size))
    param.data[...] = layout.shard(dense, module.tp_rank, module.tp_size)


def _init_weights(gpt: Module, config: Any) -> None:
    """``GPT._init_weights`` on the shards: same draws, same order (``modules()`` walks the
    same names as in the dense model), this rank's part of each."""
    for module in gpt.modules():
        if isinstance(module, _Sharded):
            _normal_shard(module, "weight", 0.02)
        elif isinstance(module, (Linear, Embedding)):
            init.normal_(module.weight, 0.0, 0.02)
        if isinstance(module, (Linear, ColumnParallelLinear, RowParallelLinear)) \
                and module.bias is not None:
            init.zeros_(module.bias)
    residual_std = 0.02 / math.sqrt(2 * config.n_layer)
    for block in gpt.h:
        _normal_shard(block.attn.c_proj, "weight", residual_std)
        _normal_shard(block.mlp.c_proj, "weight", residual_std)


def next_token_logits(gpt: Module, context: Any) -> Tensor:
    """The logits of the token after ``context`` (batch, time) over the whole vocabulary, for
    ``generate``: the last position's vocabulary shards, gathered. Under sequence parallelism
    the length must divide by t, so the context is padded on the right: the model is causal,
    so what follows the last real position does not change its logits."""
    time = context.shape[1]
    if gpt.sequence_parallel:
        pad = -time % group_rank_size(gpt.tp_group)[1]
        context = np.concatenate([context, np.zeros((context.shape[0], pad), context.dtype)], 1)
    logits = gpt(context)[0][:, time - 1, :]
    return gather_from_tensor_parallel_region(logits, gpt.tp_group)


def tensor_parallel_loss(logits: Tensor, targets: Any, group: ProcessGroup) -> Tensor:
    """The mean cross-entropy (targets of -1 ignored) of local-vocabulary logits (B, T, V/t)."""
    return vocab_parallel_cross_entropy(logits, targets, group=group, ignore_index=-1)
