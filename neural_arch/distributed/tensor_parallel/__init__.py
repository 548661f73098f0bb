"""Megatron-style tensor parallelism: layers whose weights are split across a process group.

A column-parallel Linear splits the output features, a row-parallel Linear the input
features; put one after the other (as a transformer's MLP or attention is) and the pair needs
one all-reduce forward and one backward. The communication lives in four autograd operators
(``mappings``); ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` split the
vocabulary of a language model's embedding, LM head and loss. ``GPT(config, tp_group=g)``
(``neural_arch.models``) builds its blocks from these (``gpt``). ``group=None`` is the world.
Sequence parallelism (``sequence``; the layers' and the GPT's ``sequence_parallel=True``)
splits along the sequence what plain tensor parallelism replicates between the sub-blocks.

``load_dense_state_dict`` / ``dense_state_dict`` go between a dense model's state and the
shards (``sharding``); ``Layout`` says which part of a dense parameter each rank holds.
``clip_grad_norm_`` clips by the norm of the whole model's gradient (``clip_grad``).
"""
from __future__ import annotations

from .clip_grad import clip_grad_norm_, grad_norm, norm_parameters
from .cross_entropy import vocab_parallel_cross_entropy
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .layout import Layout
from .mappings import (copy_to_tensor_parallel_region, gather_from_tensor_parallel_region,
                       reduce_from_tensor_parallel_region, scatter_to_tensor_parallel_region)
from .sequence import (SequenceParallelLayerNorm, SequenceParallelPositionEmbedding,
                       gather_from_sequence_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region)
from .sharding import dense_state_dict, load_dense_state_dict

__all__ = [
    "ColumnParallelLinear", "Layout", "RowParallelLinear", "SequenceParallelLayerNorm",
    "SequenceParallelPositionEmbedding", "VocabParallelEmbedding", "clip_grad_norm_",
    "copy_to_tensor_parallel_region", "dense_state_dict", "gather_from_sequence_parallel_region",
    "gather_from_tensor_parallel_region", "grad_norm", "load_dense_state_dict",
    "norm_parameters",
    "reduce_from_tensor_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "scatter_to_tensor_parallel_region",
    "vocab_parallel_cross_entropy",
]
