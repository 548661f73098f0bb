"""Megatron-style tensor parallelism: layers whose weights are split across a process group.

A column-parallel Linear splits the output features, a row-parallel Linear the input
features; put one after the other (as a transformer's MLP or attention is) and the pair needs
one all-reduce forward and one backward. The communication lives in four autograd operators
(``mappings``); ``VocabParallelEmbedding`` and ``vocab_parallel_cross_entropy`` split the
vocabulary of a language model's embedding, LM head and loss. ``group=None`` is the world.
Sequence parallelism (``sequence``; the layers' ``sequence_parallel=True``) splits along the
sequence what plain tensor parallelism replicates between the sub-blocks.

A dense model is split from outside, as with torch: ``parallelize_module(module, mesh, plan)``
(``parallelize``) with the styles ``ColwiseParallel``, ``RowwiseParallel``,
``SequenceParallel`` and ``HeadwiseParallel`` (``style``) and the layouts ``Replicate`` and
``Shard`` (``placement``); ``parallelize_gpt(model, mesh, sequence_parallel=...)`` applies
``gpt_tp_plan`` to a ``GPT`` (``gpt``).

``load_dense_state_dict`` / ``dense_state_dict`` go between a dense model's state and the
shards (``sharding``); ``Layout`` says which part of a dense parameter each rank holds.
``clip_grad_norm_`` clips by the norm of the whole model's gradient (``clip_grad``).
"""
from __future__ import annotations

from .attention import ParallelCausalSelfAttention
from .clip_grad import clip_grad_norm_, grad_norm, norm_parameters
from .cross_entropy import vocab_parallel_cross_entropy
from .gpt import TensorParallelGPT, gpt_tp_plan, parallelize_gpt
from .layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
from .layout import Layout
from .mappings import (copy_to_tensor_parallel_region, gather_from_tensor_parallel_region,
                       reduce_from_tensor_parallel_region, scatter_to_tensor_parallel_region)
from .parallelize import parallelize_module
from .placement import Placement, Replicate, Shard
from .sequence import (SequenceParallelLayerNorm, SequenceParallelPositionEmbedding,
                       gather_from_sequence_parallel_region,
                       reduce_scatter_to_sequence_parallel_region,
                       scatter_to_sequence_parallel_region)
from .sharding import dense_state_dict, load_dense_state_dict
from .style import (ColwiseParallel, HeadwiseParallel, ParallelStyle, RowwiseParallel,
                    SequenceParallel)

__all__ = [
    "ColumnParallelLinear", "ColwiseParallel", "HeadwiseParallel", "Layout",
    "ParallelCausalSelfAttention", "ParallelStyle", "Placement", "Replicate",
    "RowParallelLinear", "RowwiseParallel", "SequenceParallel", "SequenceParallelLayerNorm",
    "SequenceParallelPositionEmbedding", "Shard", "TensorParallelGPT", "VocabParallelEmbedding",
    "clip_grad_norm_", "copy_to_tensor_parallel_region", "dense_state_dict",
    "gather_from_sequence_parallel_region", "gather_from_tensor_parallel_region",
    "gpt_tp_plan", "grad_norm", "load_dense_state_dict", "norm_parameters",
    "parallelize_gpt", "parallelize_module",
    "reduce_from_tensor_parallel_region", "reduce_scatter_to_sequence_parallel_region",
    "scatter_to_sequence_parallel_region", "scatter_to_tensor_parallel_region",
    "vocab_parallel_cross_entropy",
]
