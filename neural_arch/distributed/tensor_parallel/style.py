"""The parallel styles of ``parallelize_module``, with torch's names: each turns one dense
module into its tensor-parallel counterpart over a group, keeping the dense weights (this
rank's shard of a split one, the very parameter of a replicated one).

- ``ColwiseParallel``: a ``Linear`` split by output features (``ColumnParallelLinear``).
  ``input_layouts=Shard(1)``: its input is this rank's positions (sequence parallelism) and is
  all-gathered first. ``output_layouts=Replicate()``: the output features are all-gathered.
  ``stride``: the output packs that many blocks, each split on its own (a fused q | k | v).
- ``RowwiseParallel``: a ``Linear`` split by input features (``RowParallelLinear``; its input
  is the feature shard a colwise layer leaves, or with ``input_layouts=Replicate()`` the whole
  input), or an ``Embedding`` split by rows (``VocabParallelEmbedding``). The partial sums are
  all-reduced, or with ``output_layouts=Shard(1)`` reduce-scattered along the sequence.
- ``SequenceParallel``: a ``LayerNorm``, a ``Dropout`` or a position ``Embedding`` run on this
  rank's positions (``sequence``); its parameters stay replicated.
- ``HeadwiseParallel`` (not in torch, whose attention takes separate q, k, v projections): a
  ``CausalSelfAttention`` split by heads (``attention``).

There is no distributed tensor: every output is this rank's local array, so torch's
``use_local_output=False`` is refused rather than ignored.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

from ...nn import CausalSelfAttention, Dropout, Embedding, LayerNorm, Linear, Module
from ..group.world import ProcessGroup
from .attention import ParallelCausalSelfAttention
from .dropout import PartDropout
from .layers import (ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding,
                     _generator_aside)
from .placement import SEQUENCE_DIMS, layout_kind
from .sequence import SequenceParallelLayerNorm, SequenceParallelPositionEmbedding

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel",
           "HeadwiseParallel"]


class ParallelStyle:
    """A way to parallelize one module: ``_apply(module, group)`` returns the module to put in
    its place (``parallelize_module`` does the replacing)."""

    accepts: Tuple[type, ...] = ()

    def _apply(self, module: Module, group: Optional[ProcessGroup]) -> Module:
        raise NotImplementedError

    def _check_type(self, module: Module) -> None:
        # exact types: a layer that is already parallel (or a subclass with its own forward)
        # would otherwise be split a second time, or lose what its forward adds
        if type(module) not in self.accepts:
            kinds = " or ".join(t.__name__ for t in self.accepts)
            raise TypeError(f"{type(self).__name__} applies to a {kinds}, got "
                            f"{type(module).__name__}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({fields})"


def _local_output_only(style: str, use_local_output: bool) -> None:
    if not use_local_output:
        raise ValueError(f"{style}: use_local_output=False asks for a distributed tensor; "
                         "outputs here are always this rank's local arrays")


def _kept_mode(new: Module, old: Module) -> Module:
    return new.train(old.training)


class ColwiseParallel(ParallelStyle):
    """A ``Linear`` split by output features (see the module docstring)."""

    accepts = (Linear,)

    def __init__(self, input_layouts: Any = None, output_layouts: Any = None,
                 use_local_output: bool = True, *, stride: int = 1) -> None:
        name = type(self).__name__
        _local_output_only(name, use_local_output)
        self.sequence_input = layout_kind(input_layouts, name, "input_layouts",
                                          ("replicate", "sequence")) == "sequence"
        self.gather_output = layout_kind(output_layouts, name, "output_layouts",
                                         ("feature", "replicate")) == "replicate"
        self.stride = stride

    def _apply(self, module: Module, group: Optional[ProcessGroup]) -> Module:
        self._check_type(module)
        return _kept_mode(ColumnParallelLinear.from_dense(
            module, gather_output=self.gather_output, group=group, stride=self.stride,
            sequence_parallel=self.sequence_input), module)


class RowwiseParallel(ParallelStyle):
    """A ``Linear`` split by input features, or an ``Embedding`` by rows (the vocabulary)."""

    accepts = (Linear, Embedding)

    def __init__(self, input_layouts: Any = None, output_layouts: Any = None,
                 use_local_output: bool = True) -> None:
        name = type(self).__name__
        _local_output_only(name, use_local_output)
        self.input_layouts = input_layouts
        self.sequence_output = layout_kind(output_layouts, name, "output_layouts",
                                           ("replicate", "sequence")) == "sequence"

    def _apply(self, module: Module, group: Optional[ProcessGroup]) -> Module:
        self._check_type(module)
        name = type(self).__name__
        if isinstance(module, Embedding):  # token ids come whole to every rank
            layout_kind(self.input_layouts, f"{name} of an Embedding", "input_layouts",
                        ("replicate",))
            return _kept_mode(VocabParallelEmbedding.from_dense(
                module, group, sequence_parallel=self.sequence_output), module)
        input_is_parallel = layout_kind(self.input_layouts, name, "input_layouts",
                                        ("feature", "replicate")) == "feature"
        return _kept_mode(RowParallelLinear.from_dense(
            module, input_is_parallel=input_is_parallel, group=group,
            sequence_parallel=self.sequence_output), module)


class SequenceParallel(ParallelStyle):
    """A ``LayerNorm``, ``Dropout`` or position ``Embedding`` on this rank's positions."""

    accepts = (LayerNorm, Dropout, Embedding)

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        if sequence_dim not in SEQUENCE_DIMS:
            raise ValueError(f"SequenceParallel: sequence_dim={sequence_dim!r}; the sequence "
                             f"is dimension 1 of (batch, time, features) (or -2)")
        self.sequence_dim = sequence_dim

    def _apply(self, module: Module, group: Optional[ProcessGroup]) -> Module:
        self._check_type(module)
        if isinstance(module, Dropout):
            return _kept_mode(PartDropout(module.p, group, dim=-2), module)
        with _generator_aside():  # the new module's own initial weights are replaced
            if isinstance(module, LayerNorm):
                new = SequenceParallelLayerNorm(module.normalized_shape, group, eps=module.eps,
                                                elementwise_affine=module.elementwise_affine,
                                                bias=module.bias is not None)
            else:
                new = SequenceParallelPositionEmbedding(module.num_embeddings,
                                                        module.embedding_dim, group)
        for name, param in module._parameters.items():  # the same (replicated) parameters,
            new._store(new._parameters, name, param)     # in their places (state-dict order)
        return _kept_mode(new, module)


class HeadwiseParallel(ParallelStyle):
    """A ``CausalSelfAttention`` split by heads; ``input_layouts`` / ``output_layouts``
    ``Shard(1)`` for a sequence-parallel input / output."""

    accepts = (CausalSelfAttention,)

    def __init__(self, input_layouts: Any = None, output_layouts: Any = None) -> None:
        name = type(self).__name__
        self.sequence_input = layout_kind(input_layouts, name, "input_layouts",
                                          ("replicate", "sequence")) == "sequence"
        self.sequence_output = layout_kind(output_layouts, name, "output_layouts",
                                           ("replicate", "sequence")) == "sequence"

    def _apply(self, module: Module, group: Optional[ProcessGroup]) -> Module:
        self._check_type(module)
        return ParallelCausalSelfAttention(module, group, sequence_input=self.sequence_input,
                                           sequence_output=self.sequence_output)
