"""The tensor-parallel group as the layers see it: its size, this process's rank, and the
divisibility every split of a dimension needs.

``group=None`` means the whole world, as for the collectives. The layers keep the argument as
given and pass it on to every collective: the default group takes the collectives' fast path.
"""
from __future__ import annotations

from typing import Optional, Tuple

from ..group.world import ProcessGroup, resolve_group


def group_rank_size(group: Optional[ProcessGroup]) -> Tuple[int, int]:
    """(rank in ``group``, group size); raises if this process is not a member, since a layer
    sharded over a group it does not belong to has no shard to hold."""
    pg = resolve_group(group)
    if not pg.is_member:
        raise ValueError(f"this process (global rank {pg.global_rank}) is not a member of the "
                         f"tensor-parallel group of ranks {list(pg.ranks)}")
    return pg.rank, pg.size


def divide(layer: str, what: str, size: int, parts: int) -> int:
    """``size // parts``; a ValueError naming the layer, the size and the split when it does
    not divide (an uneven split would give ranks shards of different shapes)."""
    if not isinstance(size, int) or isinstance(size, bool) or size < 1:
        raise TypeError(f"{layer}: {what} must be a positive int, got {size!r}")
    if size % parts:
        raise ValueError(f"{layer}: {what} ({size}) is not divisible by the tensor-parallel "
                         f"size {parts}")
    return size // parts

