"""Making model replicas start equal: every data-parallel wrapper checks that the ranks built
the same model and then starts every rank from rank 0's values."""
from __future__ import annotations

from typing import Any

from ..core import Tensor
from . import collectives
from .group import resolve_group


def check_replicas_agree(module: Any, group: Any, owner: str) -> None:
    """ValueError unless every rank's ``module`` has the same parameter names, shapes and
    dtypes; the message names the first difference and the rank that has it."""
    mine = [(n, tuple(p.array.shape), str(p.array.dtype)) for n, p in module.named_parameters()]
    everyone = collectives.all_gather_object(mine, group=group)
    for rank, theirs in enumerate(everyone):
        if theirs == everyone[0]:
            continue
        for i in range(max(len(theirs), len(everyone[0]))):
            a = everyone[0][i] if i < len(everyone[0]) else None
            b = theirs[i] if i < len(theirs) else None
            if a != b:
                raise ValueError(f"{owner}: model replicas differ at parameter #{i}: rank 0 has "
                                 f"{a}, rank {rank} has {b}")


def broadcast_module_state(module: Any, group: Any, buffers: bool = True) -> None:
    """Copy the group's first rank's parameters (and buffers) into every rank's, in place."""
    source = resolve_group(group).ranks[0]  # a global rank: the group may not hold rank 0
    tensors = [p for _, p in module.named_parameters()]
    if buffers and hasattr(module, "named_buffers"):
        tensors += [b for _, b in module.named_buffers()]
    for t in tensors:
        data = t.array if isinstance(t, Tensor) else t  # an array's .array is a memoryview
        if getattr(data, "size", 0):  # NumPy, or CuPy (staged through the host)
            collectives.broadcast(data, src=source, group=group)
