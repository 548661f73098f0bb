"""Tensor-parallel layers: a Linear split by output rows or input columns, and an embedding
split by vocabulary rows.

Each layer holds one shard of the dense layer's parameters; ``tp_layout`` maps a parameter's
name to the ``Layout`` that says which part (None: replicated, every rank holds all of it), and
``load_dense_state_dict`` / ``dense_state_dict`` (``sharding``) use it to go between the dense
state and the shards. ``from_dense(layer)`` builds the parallel layer from a dense one.

Initialisation draws the whole dense parameter from the global generator, exactly as the dense
layer would, and keeps this rank's shard: the parameters do not depend on the tensor-parallel
size, every rank consumes the same random draws (so their generators stay in step, as dropout
needs), and a model built under a seed is the sharded copy of the dense model built under it.
The dense draw costs one dense parameter of memory for the time of the constructor.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Dict, Iterator, Optional

import numpy as np

from ... import functional as F
from ...backends import xp_of
from ...core.random import get_rng, set_rng
from ...core.tensor import Tensor
from ...nn import Embedding, Linear, Module, Parameter, init
from ...nn._dtype import as_tensor, parameter_dtype
from ..group.world import ProcessGroup
from ._group import divide, group_rank_size
from .layout import Layout
from .mappings import (copy_to_tensor_parallel_region, gather_from_tensor_parallel_region,
                       reduce_from_tensor_parallel_region, scatter_to_tensor_parallel_region)
from .sequence import (gather_from_sequence_parallel_region,
                       reduce_scatter_to_sequence_parallel_region)
from .sharding import load_dense_state_dict

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding"]


def _dense_linear_init(out_features: int, in_features: int, bias: bool, dtype: np.dtype):
    """The weight and bias ``nn.Linear`` would draw (same generator calls, same order)."""
    weight = np.empty((out_features, in_features), dtype=dtype)
    init.kaiming_uniform_(weight, a=math.sqrt(5))
    if not bias:
        return weight, None
    bound = 1.0 / math.sqrt(in_features)
    return weight, init.uniform_(np.empty(out_features, dtype=dtype), -bound, bound)


@contextlib.contextmanager
def _generator_aside() -> Iterator[None]:
    """For ``from_dense``, whose copied weights replace the initial ones: the constructor draws
    from a throwaway generator, and the global stream is left as it was."""
    previous = set_rng(np.random.default_rng(0))
    try:
        yield
    finally:
        set_rng(previous)


def _loaded(layer: Module, dense: Module) -> Module:
    load_dense_state_dict(layer, dense.state_dict())
    return layer


class _Sharded(Module):
    """What the parallel layers share: the group, this rank's place in it, the layouts."""

    tp_layout: Dict[str, Optional[Layout]]

    def _setup(self, group: Optional[ProcessGroup]) -> None:
        self.group = group
        self.tp_rank, self.tp_size = group_rank_size(group)

    def _keep(self, name: str, dense: Optional[np.ndarray]) -> None:
        """Register this rank's shard of the dense ``dense`` as parameter ``name``."""
        if dense is None:
            self.register_parameter(name, None)
            return
        layout = self.tp_layout[name]
        local = dense if layout is None else layout.shard(dense, self.tp_rank, self.tp_size)
        setattr(self, name, Parameter(np.array(local, copy=True)))

    def _check_input(self, x: Tensor, features: int, what: str) -> None:
        if x.ndim < 1 or x.shape[-1] != features:
            raise ValueError(f"{type(self).__name__} expects {what} of {features} features "
                             f"(tp={self.tp_size}, rank {self.tp_rank}), got input of shape "
                             f"{tuple(x.shape)}")


class ColumnParallelLinear(_Sharded):
    """``y = x @ W.T + b`` with W's output rows split: this rank holds rows
    ``[r*out/t, (r+1)*out/t)`` of the dense (out, in) weight and the same slice of the bias.

    The input is full on every rank (it enters through ``copy_to_tensor_parallel_region``, whose
    backward sums the ranks' input gradients). The output is this rank's out/t features, or with
    ``gather_output`` all of them. ``stride`` > 1 says the output packs that many equal blocks
    each split on its own (``Layout``), as attention's fused q | k | v.

    With ``sequence_parallel`` the input is this rank's positions of the sequence (the
    second-to-last dimension) and is all-gathered first; the gather's backward reduce-scatters
    the input gradient, which sums the ranks' parts as the all-reduce did (``sequence``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 gather_output: bool = False, group: Optional[ProcessGroup] = None, *,
                 stride: int = 1, sequence_parallel: bool = False, dtype: Any = None) -> None:
        super().__init__()
        self._setup(group)
        name = type(self).__name__
        divide(name, "in_features", in_features, 1)
        if not isinstance(stride, int) or stride < 1:
            raise ValueError(f"{name}: stride must be a positive int, got {stride!r}")
        per_block = divide(name, "out_features", out_features, stride)
        divide(name, "out_features" if stride == 1 else f"out_features / stride {stride}",
               per_block, self.tp_size)
        if gather_output and stride != 1:
            raise ValueError(f"{name}: gather_output would return the output in shard order, "
                             f"not the dense order, with stride {stride}; gather it yourself")
        self.in_features, self.out_features = in_features, out_features
        self.gather_output, self.stride = bool(gather_output), stride
        self.sequence_parallel = bool(sequence_parallel)
        self.out_per_rank = out_features // self.tp_size
        self.tp_layout = {"weight": Layout(0, stride), "bias": Layout(0, stride)}
        weight, b = _dense_linear_init(out_features, in_features, bias, parameter_dtype(dtype))
        self._keep("weight", weight)
        self._keep("bias", b)

    @classmethod
    def from_dense(cls, linear: Linear, gather_output: bool = False,
                   group: Optional[ProcessGroup] = None, *, stride: int = 1,
                   sequence_parallel: bool = False) -> "ColumnParallelLinear":
        """This rank's column-parallel shard of ``linear`` (its dtype kept)."""
        with _generator_aside():
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                        gather_output, group, stride=stride, sequence_parallel=sequence_parallel,
                        dtype=linear.weight.array.dtype)
        return _loaded(layer, linear)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        self._check_input(x, self.in_features, "the full input")
        x = gather_from_sequence_parallel_region(x, self.group) if self.sequence_parallel \
            else copy_to_tensor_parallel_region(x, self.group)
        y = F.linear(x, self.weight, self.bias)
        return gather_from_tensor_parallel_region(y, self.group) if self.gather_output else y

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features} " \
               f"({self.out_per_rank} on rank {self.tp_rank} of {self.tp_size}), " \
               f"bias={self.bias is not None}, gather_output={self.gather_output}"


class RowParallelLinear(_Sharded):
    """``y = x @ W.T + b`` with W's input columns split: this rank holds columns
    ``[r*in/t, (r+1)*in/t)`` of the dense (out, in) weight and the whole bias.

    Each rank's product is a partial sum over its input features; the all-reduce
    (``reduce_from_tensor_parallel_region``) completes it, and the bias is added once, after.
    With ``input_is_parallel`` (the default, after a column-parallel layer) the input is this
    rank's in/t features; else it is full and each rank takes its chunk of the last dimension.

    With ``sequence_parallel`` the partial sums are reduce-scattered along the sequence (the
    second-to-last dimension) instead: each rank gets its positions, and the bias, whose
    gradient then covers only those, is summed over the group in backward (``sequence``).
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True,
                 input_is_parallel: bool = True, group: Optional[ProcessGroup] = None, *,
                 sequence_parallel: bool = False, dtype: Any = None) -> None:
        super().__init__()
        self._setup(group)
        name = type(self).__name__
        divide(name, "out_features", out_features, 1)
        self.in_per_rank = divide(name, "in_features", in_features, self.tp_size)
        self.in_features, self.out_features = in_features, out_features
        self.input_is_parallel = bool(input_is_parallel)
        self.sequence_parallel = bool(sequence_parallel)
        if sequence_parallel and not input_is_parallel:
            raise ValueError(f"{name}: sequence_parallel needs input_is_parallel=True (the "
                             f"input of a sequence-parallel row layer is a feature shard)")
        self.tp_layout = {"weight": Layout(1), "bias": None}
        weight, b = _dense_linear_init(out_features, in_features, bias, parameter_dtype(dtype))
        self._keep("weight", weight)
        self._keep("bias", b)

    @classmethod
    def from_dense(cls, linear: Linear, input_is_parallel: bool = True,
                   group: Optional[ProcessGroup] = None, *, sequence_parallel: bool = False
                   ) -> "RowParallelLinear":
        """This rank's row-parallel shard of ``linear`` (its dtype kept)."""
        with _generator_aside():
            layer = cls(linear.in_features, linear.out_features, linear.bias is not None,
                        input_is_parallel, group, sequence_parallel=sequence_parallel,
                        dtype=linear.weight.array.dtype)
        return _loaded(layer, linear)

    def forward(self, x: Any) -> Tensor:
        x = as_tensor(x)
        if self.input_is_parallel:
            self._check_input(x, self.in_per_rank, "this rank's chunk")
        else:
            self._check_input(x, self.in_features, "the full input")
            x = scatter_to_tensor_parallel_region(x, self.group)
        y = F.linear(x, self.weight)
        if self.sequence_parallel:
            y = reduce_scatter_to_sequence_parallel_region(y, self.group)
            bias = None if self.bias is None else copy_to_tensor_parallel_region(self.bias,
                                                                                 self.group)
        else:
            y, bias = reduce_from_tensor_parallel_region(y, self.group), self.bias
        return y if bias is None else y + bias

    def extra_repr(self) -> str:
        return f"in_features={self.in_features} ({self.in_per_rank} on rank {self.tp_rank} of " \
               f"{self.tp_size}), out_features={self.out_features}, " \
               f"bias={self.bias is not None}, input_is_parallel={self.input_is_parallel}"


class VocabParallelEmbedding(_Sharded):
    """An embedding table split by rows: this rank holds rows ``[r*V/t, (r+1)*V/t)``.

    Each rank looks up the ids in its range and gives zeros for the others; the all-reduce
    (``reduce_from_tensor_parallel_region``) then puts every id's row on every rank. The
    gradient reaches only the rows this rank holds. With ``sequence_parallel`` the sum is a
    reduce-scatter along the sequence (the ids' last dimension): each rank gets its positions.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int,
                 group: Optional[ProcessGroup] = None, *, sequence_parallel: bool = False,
                 dtype: Any = None) -> None:
        super().__init__()
        self._setup(group)
        name = type(self).__name__
        divide(name, "embedding_dim", embedding_dim, 1)
        self.per_rank = divide(name, "num_embeddings", num_embeddings, self.tp_size)
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.vocab_start = self.tp_rank * self.per_rank
        self.sequence_parallel = bool(sequence_parallel)
        self.tp_layout = {"weight": Layout(0)}
        table = get_rng().standard_normal((num_embeddings, embedding_dim))  # as nn.Embedding
        self._keep("weight", table.astype(parameter_dtype(dtype)))

    @classmethod
    def from_dense(cls, embedding: Embedding, group: Optional[ProcessGroup] = None, *,
                   sequence_parallel: bool = False) -> "VocabParallelEmbedding":
        """This rank's rows of ``embedding`` (its dtype kept)."""
        with _generator_aside():
            layer = cls(embedding.num_embeddings, embedding.embedding_dim, group,
                        sequence_parallel=sequence_parallel, dtype=embedding.weight.array.dtype)
        return _loaded(layer, embedding)

    def forward(self, indices: Any) -> Tensor:
        idx = indices.array if isinstance(indices, Tensor) \
            else xp_of(self.weight.array).asarray(indices)
        if idx.dtype.kind not in "iu":
            raise ValueError(f"{type(self).__name__}: indices must be integers, got dtype "
                             f"{idx.dtype}")
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= self.num_embeddings):
            bad = int(idx.min()) if int(idx.min()) < 0 else int(idx.max())
            raise ValueError(f"{type(self).__name__}: index {bad} is out of range for "
                             f"{self.num_embeddings} embeddings (tp={self.tp_size}, rank "
                             f"{self.tp_rank})")
        local = idx - self.vocab_start
        outside = (local < 0) | (local >= self.per_rank)
        local[outside] = 0  # any valid row: its lookup is zeroed below
        rows = F.embedding(local, self.weight)
        if self.tp_size > 1:
            keep = (~outside)[..., None].astype(self.weight.array.dtype)
            rows = rows * keep  # ids of other ranks give zeros here, and no gradient
        if self.sequence_parallel:
            return reduce_scatter_to_sequence_parallel_region(rows, self.group)
        return reduce_from_tensor_parallel_region(rows, self.group)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim} (rows {self.vocab_start}.." \
               f"{self.vocab_start + self.per_rank - 1} on rank {self.tp_rank} of " \
               f"{self.tp_size})"
