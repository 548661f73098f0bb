"""How an activation lies across the tensor-parallel group where a parallel layer meets it:
``Replicate()`` (whole on every rank) or ``Shard(dim)`` (rank r holds the r-th of t equal
chunks of dimension ``dim``), torch's names for the styles' ``input_layouts`` and
``output_layouts``.

There is no distributed tensor behind them: a style turns the layouts it is given into the
collectives its layer runs (``style``). The activations the layers split are (..., time,
features): ``Shard(-1)`` is the feature dimension, and the sequence (``Shard(1)`` as torch
writes it for (batch, time, features), or ``Shard(-2)``) is what sequence parallelism splits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

__all__ = ["Placement", "Replicate", "Shard"]


class Placement:
    """A ``Replicate`` or a ``Shard``."""


@dataclass(frozen=True)
class Replicate(Placement):
    def __repr__(self) -> str:
        return "Replicate()"


@dataclass(frozen=True)
class Shard(Placement):
    dim: int

    def __repr__(self) -> str:
        return f"Shard({self.dim})"


SEQUENCE_DIMS = (1, -2)  # the time dimension of (batch, time, features), as torch and as ours


def layout_kind(layout: Any, style: str, argument: str, allowed: tuple) -> str:
    """'replicate', 'sequence' or 'feature' for ``layout`` (None: the style's default, given
    first in ``allowed``); a ValueError naming the style when it cannot run that layout."""
    kind: Optional[str] = None
    if layout is None:
        kind = allowed[0]
    elif isinstance(layout, Replicate):
        kind = "replicate"
    elif isinstance(layout, Shard):
        kind = "sequence" if layout.dim in SEQUENCE_DIMS else "feature" if layout.dim == -1 \
            else None
    if kind is None or kind not in allowed:
        raise ValueError(f"{style}: {argument}={layout!r} is not supported here; it takes "
                         f"{' or '.join(_spelled(k) for k in allowed)}")
    return kind


def _spelled(kind: str) -> str:
    return {"replicate": "Replicate()", "sequence": "Shard(1) (the sequence)",
            "feature": "Shard(-1) (the features)"}[kind]
