"""The GPT split Megatron-style across a tensor-parallel group, from the dense GPT.

``parallelize_gpt(model, device_mesh, sequence_parallel=False)`` applies ``gpt_tp_plan`` to a
dense ``GPT`` with ``parallelize_module``: per block, attention split by heads (its fused
q | k | v projection column-parallel by heads, ``c_proj`` row-parallel), the MLP's ``c_fc``
column-parallel and ``c_proj`` row-parallel, so each sub-block costs one all-reduce forward
and one backward. The token embedding is vocabulary-parallel and the LM head, tied to it,
gives each rank the logits of its own vocabulary entries, which ``vocab_parallel_cross_entropy``
turns into the loss without ever gathering them. LayerNorms, position embeddings, dropout and
the residual stream between the sub-blocks are replicated: every rank computes them whole, on
the same values, so their gradients agree without communication.

With ``sequence_parallel`` that replicated part runs on this rank's time/t positions instead
(``sequence``): each all-reduce becomes a reduce-scatter forward and an all-gather backward,
the all-gather before each column-parallel layer a reduce-scatter backward.

Each layer keeps its dense weights' shard, so a GPT built under a seed and parallelized is the
sharded dense model built under that seed, and the global generator is left where the dense
model left it (dropout then draws the dense model's masks: ``dropout``). The module names stay
the dense GPT's, so ``state_dict()`` has the dense keys (this rank's shapes).

The model becomes a ``TensorParallelGPT`` (a subclass of its class, as torch's ``fully_shard``
does): its loss is the vocabulary-parallel cross-entropy, ``predicted_tokens`` is the argmax over
the split vocabulary (``argmax``), ``generate`` gathers the last position's logits, and ``dense_state_dict`` / ``load_dense_state_dict`` go to and from the
dense model's state (``sharding``).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

import numpy as np

from ...core.tensor import Tensor
from ...models.gpt import GPT
from ..group.world import ProcessGroup
from ._group import group_rank_size
from .argmax import vocab_parallel_argmax
from .cross_entropy import vocab_parallel_cross_entropy
from .mappings import gather_from_tensor_parallel_region
from .parallelize import parallelize_module, tensor_parallel_group
from .placement import Replicate, Shard
from .sharding import dense_state_dict, load_dense_state_dict
from .style import (ColwiseParallel, HeadwiseParallel, ParallelStyle, RowwiseParallel,
                    SequenceParallel)

__all__ = ["TensorParallelGPT", "gpt_tp_plan", "parallelize_gpt", "next_token_logits",
           "tensor_parallel_loss"]


def gpt_tp_plan(sequence_parallel: bool = False) -> Dict[str, ParallelStyle]:
    """The plan ``parallelize_gpt`` applies (see the module docstring)."""
    between = Shard(1) if sequence_parallel else Replicate()  # what lies between sub-blocks
    plan: Dict[str, ParallelStyle] = {
        "wte": RowwiseParallel(input_layouts=Replicate(), output_layouts=between)}
    if sequence_parallel:
        plan.update({"wpe": SequenceParallel(), "drop": SequenceParallel()})
    plan.update({
        "h.*.attn": HeadwiseParallel(input_layouts=between, output_layouts=between),
        "h.*.mlp.c_fc": ColwiseParallel(input_layouts=between),
        "h.*.mlp.c_proj": RowwiseParallel(output_layouts=between)})
    if sequence_parallel:
        plan.update({"h.*.ln_1": SequenceParallel(), "h.*.ln_2": SequenceParallel(),
                     "h.*.attn.resid_dropout": SequenceParallel(),
                     "h.*.mlp.dropout": SequenceParallel(), "ln_f": SequenceParallel()})
    # each rank gets the logits of its vocabulary rows (its wte shard's), for every position
    plan["lm_head"] = ColwiseParallel(input_layouts=between, output_layouts=Shard(-1))
    return plan


def _check_config(config: Any, size: int, sequence_parallel: bool) -> None:
    sizes = [("n_head", config.n_head), ("vocab_size", config.vocab_size),
             ("4 * n_embd", 4 * config.n_embd)]
    if sequence_parallel:  # a full context (generate's) must split over the ranks
        sizes.append(("block_size (sequence parallel)", config.block_size))
    for what, value in sizes:
        if value % size:
            raise ValueError(f"GPT: {what} ({value}) is not divisible by the tensor-parallel "
                             f"size {size}")


class TensorParallelGPT(GPT):
    """A GPT that ``parallelize_gpt`` has split; never constructed directly."""

    tp_group: Optional[ProcessGroup]
    sequence_parallel: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise TypeError("TensorParallelGPT is made by parallelize_gpt(GPT(config), "
                        "device_mesh), not constructed")

    def _loss(self, logits: Tensor, targets: Any) -> Tensor:
        return tensor_parallel_loss(logits, targets, self.tp_group)

    def _next_token_logits(self, context: Any) -> Tensor:
        return next_token_logits(self, context)

    def predicted_tokens(self, logits: Any) -> Any:
        """The argmax token ids (B, T) of this rank's vocabulary shard ``logits`` (B, T, V/t)
        over the whole vocabulary (``Trainer`` accuracy); collective over the tp group."""
        return vocab_parallel_argmax(logits, self.tp_group)

    def load_dense_state_dict(self, state_dict: Any, strict: bool = True) -> Any:
        """Each rank takes its shards of a dense GPT's ``state_dict()``."""
        return load_dense_state_dict(self, state_dict, strict)

    def dense_state_dict(self) -> Any:
        """The dense GPT's ``state_dict()`` (same keys and shapes), gathered over the group:
        every rank of it must call this, and all get the same dict."""
        return dense_state_dict(self)


_PARALLEL_CLASSES: Dict[type, type] = {GPT: TensorParallelGPT}


def _parallel_class(cls: type) -> type:
    """``TensorParallelGPT`` for a GPT; for a subclass of GPT, one that keeps its methods."""
    if cls not in _PARALLEL_CLASSES:
        _PARALLEL_CLASSES[cls] = type(f"TensorParallel{cls.__name__}", (TensorParallelGPT, cls),
                                      {"__module__": cls.__module__})
    return _PARALLEL_CLASSES[cls]


def parallelize_gpt(model: GPT, device_mesh: Any = None, sequence_parallel: bool = False
                    ) -> GPT:
    """Split the dense ``model`` over ``device_mesh`` (a 1-D mesh, a group, or None for the
    world), in place, keeping this rank's shard of its weights; returns it."""
    if not isinstance(model, GPT):
        raise TypeError(f"parallelize_gpt takes a GPT, got {type(model).__name__}")
    if isinstance(model, TensorParallelGPT):
        raise ValueError("parallelize_gpt: this GPT is already tensor-parallel")
    group = tensor_parallel_group(device_mesh)
    _check_config(model.config, group_rank_size(group)[1], sequence_parallel)
    parallelize_module(model, group, gpt_tp_plan(bool(sequence_parallel)))
    model.__class__ = _parallel_class(type(model))
    model.tp_group, model.sequence_parallel = group, bool(sequence_parallel)
    return model


def next_token_logits(gpt: TensorParallelGPT, context: Any) -> Tensor:
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


def tensor_parallel_loss(logits: Tensor, targets: Any, group: Optional[ProcessGroup]) -> Tensor:
    """The mean cross-entropy (targets of -1 ignored) of local-vocabulary logits (B, T, V/t)."""
    return vocab_parallel_cross_entropy(logits, targets, group=group, ignore_index=-1)
