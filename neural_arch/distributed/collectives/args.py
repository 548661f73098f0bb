"""The argument checks the public collectives share (``tensors``, ``rooted``), and the
unpacking of a gather's result into per-rank tensors that ``gather`` and ``all_gather`` share.

The checks run on the calling thread, before a collective takes its sequence number, so a bad
argument raises there, naming the value, instead of inside async work or on one rank only.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import algorithms
from ..buffers import as_list, checked_array, same_layout, wrap_like
from ..group.world import ProcessGroup, resolve_group


def usable_group(group: Optional[ProcessGroup], op: str) -> ProcessGroup:
    """The group ``group`` names (None: the default one), checked usable for ``op``."""
    pg = resolve_group(group)
    pg.check_usable(op)
    return pg


# how a forced algorithm marks a collective's fingerprint (kept short: a message header holds
# 24 bytes of the operation's name, "reduce_scatter@ring:prod" at most)
_TAGS = {"ring": "@ring", "recursive_doubling": "@rd", "shm_direct": "@shm", "native": "@nat",
         "tree": "@tree", "dissemination": "@dis"}


def check_algorithm(collective: str, algorithm: Optional[str], pg: ProcessGroup) -> str:
    """Reject an unknown algorithm name, or one that cannot run on ``pg``'s transport, now, on
    the caller's thread, not inside async work. Returns the mark of what the call forces
    (``algorithms.forced``: its ``algorithm=``, or ``NEURAL_ARCH_ALLREDUCE_ALGO`` for an
    all-reduce without one) after the collective's name in its fingerprint
    (``"all_reduce@ring:sum"``; ``""`` where the choice is automatic): ranks that force
    different algorithms, or one and not the others, then disagree on the fingerprint and
    raise ``CollectiveMismatchError`` where their messages meet, or in the barrier a forced
    algorithm first takes where it runs elsewhere than the automatic choice (a message
    algorithm on shared memory, MPI's or NCCL's own collectives: ``algorithms._chosen``),
    instead of exchanging messages that look alike and ending with different results, or
    waiting on channels the others never use until the group's timeout."""
    if algorithm is not None:
        algorithms.normalize(collective, algorithm)  # the unknown name's error, on any group
    name = algorithms.forced(collective, pg.transport, algorithm)
    return "" if name is None else _TAGS[name]


def tensor_list(items: Any, what: str, ref: np.ndarray, size: int,
                writable: bool = True) -> list[np.ndarray]:
    """The arrays of a per-rank list, checked against the group size and ``ref``'s layout."""
    items = as_list(items, what)
    if len(items) != size:
        raise ValueError(f"{what} has {len(items)} entries but the group has {size} ranks")
    arrays = [checked_array(x, f"{what}[{i}]", writable=writable) for i, x in enumerate(items)]
    for i, arr in enumerate(arrays):
        same_layout(arr, ref, f"{what}[{i}]")
    return arrays


def unpack_blocks(blocks: np.ndarray, outputs: Optional[list[np.ndarray]], like: Any,
                  given: Any) -> Any:
    """A gather's result, ``blocks`` (one per rank): copied into ``outputs``, the arrays of the
    caller's list ``given`` (which is returned), or with no list, a new list of the blocks
    wrapped like the sent tensor ``like``."""
    if outputs is None:
        return [wrap_like(like, block) for block in blocks]
    for out, block in zip(outputs, blocks):
        out[...] = block.reshape(out.shape)
    return given
