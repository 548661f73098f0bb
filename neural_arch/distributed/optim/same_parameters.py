"""The check both ZeRO optimizers make first: every rank passed the same parameters.

Each rank splits the parameters over the ranks from their shapes alone, so all must hold the
same groups of the same shapes and dtypes in the same order; otherwise the shards they
exchange would not line up. The layout (per group, each parameter's shape and dtype) is
all-gathered, and every rank raises the same error, naming the ranks that differ and the first
difference.
"""
from __future__ import annotations

from typing import Any, Dict, List, Sequence

from .. import collectives


def parameter_layout(param_groups: Sequence[Dict[str, Any]]) -> List[list]:
    """Per group, each parameter's (shape, dtype name)."""
    return [[(tuple(p.array.shape), str(p.array.dtype)) for p in group["params"]]
            for group in param_groups]


def check_same_parameters(param_groups: Sequence[Dict[str, Any]], process_group: Any,
                          global_ranks: Sequence[int], who: str) -> None:
    """ValueError on every rank of ``process_group`` (``global_ranks``: its members) unless
    all passed the same ``param_groups`` layout; ``who`` names the optimizer."""
    everyone = collectives.all_gather_object(parameter_layout(param_groups), group=process_group)
    differ = [r for r, theirs in enumerate(everyone) if theirs != everyone[0]]
    if differ:
        first = differ[0]
        raise ValueError(
            f"{who}: the parameters differ across ranks: ranks "
            f"{[global_ranks[r] for r in differ]} passed other parameters than rank "
            f"{global_ranks[0]}; {_first_difference(everyone[0], everyone[first])} on rank "
            f"{global_ranks[0]} but {_first_difference(everyone[first], everyone[0])} on rank "
            f"{global_ranks[first]} (every rank must pass the same parameters in the same "
            f"order)")


def _first_difference(mine: list, theirs: list) -> str:
    """Where ``mine`` (groups of (shape, dtype)) first differs from ``theirs``, described."""
    if len(mine) != len(theirs):
        return f"{len(mine)} parameter groups"
    for g, (a, b) in enumerate(zip(mine, theirs)):
        if len(a) != len(b):
            return f"{len(a)} parameters in group {g}"
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return f"parameter #{i} of group {g} has shape {x[0]} and dtype {x[1]}"
    return "the same parameters"
