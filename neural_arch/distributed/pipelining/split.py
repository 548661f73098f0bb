"""``pipeline_split``: a model cut into consecutive stage modules that share its parameters.

A ``Sequential`` is cut between layers, a GPT between blocks (the first stage also runs the
embeddings, the last the final LayerNorm and the LM head). The cut balances parameter counts:
of all ways to cut into contiguous non-empty pieces, the one whose largest piece is smallest,
then whose longest piece (in layers) is shortest. The stages hold the model's own modules, so
a dense model split this way can be compared parameter by parameter, and an optimizer built on
a stage's ``parameters()`` updates the model itself.

Tied weights: a GPT built with ``tie_weights`` uses one matrix as token embedding and LM head.
The first and the last stage both hold it (the same parameter, where they share a process)
and say so in ``pipeline_ties``; the schedules then add the two stages' gradients of it after
every step (see ``stage``). With one stage nothing is tied across stages.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Any, List, Sequence, Tuple

import numpy as np

from ...core import Tensor, is_grad_enabled
from ...nn import Module, ModuleList, Sequential
from ...utils.checkpoint import checkpoint

_GPT_PARTS = ("wte", "wpe", "drop", "h", "ln_f", "lm_head")


def _count(module: Module) -> int:
    return sum(int(np.asarray(p.array).size) for p in module.parameters())


def balanced_bounds(costs: Sequence[int], parts: int, extra_first: int = 0,
                    extra_last: int = 0) -> List[Tuple[int, int]]:
    """[start, stop) of ``parts`` contiguous non-empty pieces of ``costs`` minimising the
    largest piece's cost (``extra_first``/``extra_last`` added to the first/last piece), then
    its length. Exact (dynamic programming over cut points): models have few layers."""
    n = len(costs)
    if parts < 1 or parts > n:
        raise ValueError(f"cannot split {n} layers into {parts} non-empty stages")
    prefix = [0]
    for c in costs:
        prefix.append(prefix[-1] + c)

    def cost(k: int, i: int, j: int) -> Tuple[int, int]:  # piece k covers layers [i, j)
        extra = (extra_first if k == 0 else 0) + (extra_last if k == parts - 1 else 0)
        return (prefix[j] - prefix[i] + extra, j - i)

    inf = (float("inf"), float("inf"))
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = (0, 0)
    for k in range(1, parts + 1):
        for j in range(k, n - (parts - k) + 1):
            for i in range(k - 1, j):
                if best[k - 1][i] == inf:
                    continue
                value = max(best[k - 1][i], cost(k - 1, i, j))
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    bounds, j = [], n
    for k in range(parts, 0, -1):
        i = cut[k][j]
        bounds.append((i, j))
        j = i
    return bounds[::-1]


class GPTStage(Module):
    """Consecutive blocks of a GPT; the first stage also embeds token ids, the last also
    applies the final LayerNorm and the LM head (and returns logits)."""

    def __init__(self, gpt: Module, blocks: Sequence[Module], first: bool, last: bool,
                 last_block: Module) -> None:
        super().__init__()
        self.first, self.last = first, last
        self.config = getattr(gpt, "config", None)
        if first:
            self.wte, self.wpe, self.drop = gpt.wte, gpt.wpe, gpt.drop
        self.h = ModuleList(blocks)
        if last:
            self.ln_f, self.lm_head = gpt.ln_f, gpt.lm_head
        self._last_block = [last_block]  # a list: not registered as a child

    def forward(self, x: Any) -> Tensor:
        if self.first:
            idx = x.array if isinstance(x, Tensor) else np.asarray(x)
            if idx.ndim != 2 or idx.dtype.kind not in "iu":
                raise ValueError(f"the first GPT stage expects integer token ids of shape "
                                 f"(batch, time), got {idx.dtype} {idx.shape}")
            block_size = getattr(self.config, "block_size", None)
            if block_size is not None and idx.shape[1] > block_size:
                raise ValueError(f"sequence length {idx.shape[1]} exceeds block_size "
                                 f"{block_size}")
            x = self.drop(self.wte(idx) + self.wpe(np.arange(idx.shape[1], dtype=np.int64)))
        recompute = (getattr(self.config, "gradient_checkpointing", False) and self.training
                     and is_grad_enabled())
        for block in self.h:
            # as GPT: every block but the model's last recomputes its activations in backward
            x = checkpoint(block, x) if recompute and block is not self._last_block[0] \
                else block(x)
        if self.last:
            x = self.lm_head(self.ln_f(x))
        return x


def _is_gpt(model: Any) -> bool:
    return isinstance(model, Module) and all(name in model._modules for name in _GPT_PARTS)


def _split_gpt(model: Module, num_stages: int) -> List[Module]:
    blocks = list(model.h)
    if num_stages > len(blocks):
        raise ValueError(f"cannot split a GPT of {len(blocks)} blocks into {num_stages} stages: "
                         "every stage needs at least one block")
    tied = model.lm_head.weight is model.wte.weight
    first_extra = _count(model.wte) + _count(model.wpe)
    last_extra = _count(model.ln_f) + _count(model.lm_head)
    bounds = balanced_bounds([_count(b) for b in blocks], num_stages, first_extra, last_extra)
    stages = []
    for k, (i, j) in enumerate(bounds):
        stage = GPTStage(model, blocks[i:j], k == 0, k == num_stages - 1, blocks[-1])
        stage.pipeline_ties = ({"wte.weight": (model.wte.weight, (0, num_stages - 1))}
                               if tied and num_stages > 1 and k in (0, num_stages - 1) else {})
        stages.append(stage)
    return stages


def pipeline_split(model: Any, num_stages: int) -> List[Module]:
    """``model`` cut into ``num_stages`` stage modules, in order, sharing its parameters.

    ``model`` is a ``Sequential`` (cut between layers; each stage a ``Sequential`` keeping the
    layer names), a GPT (cut between blocks, ``GPTStage``; anything with ``wte``, ``wpe``,
    ``drop``, ``h``, ``ln_f`` and ``lm_head`` children, such as a tensor-parallel GPT, whose
    blocks move as they are), or a list of modules (each layer one piece, cut like a
    ``Sequential``).
    """
    if isinstance(num_stages, bool) or not isinstance(num_stages, (int, np.integer)):
        raise TypeError(f"num_stages must be an int, got {num_stages!r}")
    if num_stages < 1:
        raise ValueError(f"num_stages must be at least 1, got {num_stages}")
    if _is_gpt(model):
        return _split_gpt(model, int(num_stages))
    if isinstance(model, (list, tuple)):
        model = Sequential(*model)
    if not isinstance(model, Sequential):
        raise TypeError(f"pipeline_split cuts a Sequential, a GPT or a list of modules, got "
                        f"{type(model).__name__}; build PipelineStage from your own pieces "
                        "for anything else")
    items = list(model._modules.items())
    if num_stages > len(items):
        raise ValueError(f"cannot split a Sequential of {len(items)} layers into {num_stages} "
                         "stages: every stage needs at least one layer")
    bounds = balanced_bounds([_count(m) for _, m in items], int(num_stages))
    return [Sequential(OrderedDict(items[i:j])) for i, j in bounds]
