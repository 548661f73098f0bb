"""Collectives of arbitrary picklable objects, and the untyped-array collectives they use.

Objects travel as pickles in uint8 arrays: sizes are exchanged first, then the padded bytes.
Unpickling runs code chosen by the sender, so these calls refuse to run over a transport whose
peers are not authenticated members of the job (``TransportSpec.trusted``).
"""
from __future__ import annotations

import pickle
from typing import Any, Optional

import numpy as np

from .. import algorithms
from ..buffers import Flat
from ..group.agreement import check_same_everywhere  # noqa: F401 - its public home before
from ..group.world import ProcessGroup, resolve_group

_MISSING = object()


def all_gather_array(pg: ProcessGroup, arr: np.ndarray, op: str) -> np.ndarray:
    """Synchronous all-gather of a contiguous array of any dtype: shape (group size, *shape)."""
    fp = pg.fingerprint(op, arr.dtype, arr.size)
    out = np.empty((pg.size,) + arr.shape, dtype=arr.dtype)
    pg.run(lambda: algorithms.all_gather(pg.transport, Flat(arr).buf, out.reshape(-1), fp),
           False, fp, op)
    return out


def broadcast_array(pg: ProcessGroup, arr: np.ndarray, root: int, op: str) -> np.ndarray:
    """Synchronous in-place broadcast of a contiguous array of any dtype from group rank root."""
    fp = pg.fingerprint(f"{op}:{root}", arr.dtype, arr.size)
    pg.run(lambda: algorithms.broadcast(pg.transport, arr.reshape(-1), root, fp), False, fp, op)
    return arr


def gather_array(pg: ProcessGroup, arr: np.ndarray, root: int, op: str) -> Optional[np.ndarray]:
    """Synchronous gather of a contiguous array of any dtype to group rank ``root``: shape
    (group size, *shape) there, None elsewhere."""
    fp = pg.fingerprint(f"{op}:{root}", arr.dtype, arr.size)
    out = np.empty((pg.size,) + arr.shape, dtype=arr.dtype) if pg.rank == root else None
    pg.run(lambda: algorithms.gather(pg.transport, Flat(arr).buf,
                                     None if out is None else out.reshape(-1), root, fp),
           False, fp, op)
    return out


def _trusted_group(group: Optional[ProcessGroup], op: str) -> ProcessGroup:
    pg = resolve_group(group)
    pg.check_usable(op)
    if not pg.trusted:
        raise PermissionError(f"{op} unpickles data from peers, but backend {pg.backend!r} does "
                              "not authenticate them; use a tensor collective instead")
    return pg


def _to_bytes(obj: Any) -> np.ndarray:
    return np.frombuffer(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL), dtype=np.uint8)


def all_gather_object(object_list_or_obj: Any, obj: Any = _MISSING,
                      group: Optional[ProcessGroup] = None):
    """``all_gather_object(obj) -> list`` or PyTorch's ``all_gather_object(object_list, obj)``
    (which fills ``object_list``, one entry per rank, and returns it)."""
    pg = _trusted_group(group, "all_gather_object")
    if obj is _MISSING:
        target, obj = None, object_list_or_obj
    else:
        target = object_list_or_obj
        if not isinstance(target, list) or len(target) != pg.size:
            got = len(target) if isinstance(target, list) else type(target).__name__
            raise ValueError(f"all_gather_object object_list must be a list of {pg.size} "
                             f"entries (the group size), got {got}")
    payload = _to_bytes(obj)
    sizes = all_gather_array(pg, np.array([payload.size], dtype=np.int64), "all_gather_object")
    width = int(sizes.max())
    padded = np.zeros(width, dtype=np.uint8)
    padded[:payload.size] = payload
    rows = all_gather_array(pg, padded, "all_gather_object")
    objects = [pickle.loads(rows[i, :int(sizes[i, 0])].tobytes()) for i in range(pg.size)]
    if target is None:
        return objects
    target[:] = objects
    return target


def gather_object(obj: Any, object_gather_list: Optional[list] = None, dst: int = 0,
                  group: Optional[ProcessGroup] = None) -> Optional[list]:
    """PyTorch's ``gather_object``: rank ``dst`` gets every rank's ``obj`` in rank order, in
    ``object_gather_list`` (a list of group-size entries, replaced) or a new list it returns;
    other ranks pass None and get None. Only ``dst`` receives the pickles (sizes travel to
    every rank first, so that each pads its pickle to the largest)."""
    pg = _trusted_group(group, "gather_object")
    root = pg.group_rank_of(dst, "dst")
    if pg.rank != root and object_gather_list is not None:
        raise ValueError(f"gather_object: object_gather_list must be None on rank "
                         f"{pg.global_rank}; only the dst rank {dst} passes one")
    if pg.rank == root and object_gather_list is not None and (
            not isinstance(object_gather_list, list) or len(object_gather_list) != pg.size):
        got = (len(object_gather_list) if isinstance(object_gather_list, list)
               else type(object_gather_list).__name__)
        raise ValueError(f"gather_object object_gather_list must be a list of {pg.size} "
                         f"entries (the group size), got {got}")
    payload = _to_bytes(obj)
    sizes = all_gather_array(pg, np.array([payload.size], dtype=np.int64), "gather_object")
    padded = np.zeros(int(sizes.max()), dtype=np.uint8)
    padded[:payload.size] = payload
    rows = gather_array(pg, padded, root, "gather_object")
    if rows is None:
        return None
    objects = [pickle.loads(rows[i, :int(sizes[i, 0])].tobytes()) for i in range(pg.size)]
    if object_gather_list is None:
        return objects
    object_gather_list[:] = objects
    return object_gather_list


def broadcast_object_list(object_list: list, src: int = 0, group: Optional[ProcessGroup] = None,
                          device: Any = None) -> list:
    """Replace the entries of ``object_list`` on every rank by those of rank ``src``.

    Every rank passes a list of the same length (entries other than ``src``'s are overwritten).
    """
    pg = _trusted_group(group, "broadcast_object_list")
    if not isinstance(object_list, list):
        raise TypeError(f"broadcast_object_list needs a list, got {type(object_list).__name__}")
    root = pg.group_rank_of(src, "src")
    if pg.rank == root:
        pickles = [_to_bytes(o) for o in object_list]
        sizes = np.array([p.size for p in pickles], dtype=np.int64)
    else:
        sizes = np.zeros(len(object_list), dtype=np.int64)
    broadcast_array(pg, sizes, root, "broadcast_object_list")
    payload = (np.concatenate(pickles) if pg.rank == root and pickles
               else np.empty(int(sizes.sum()), dtype=np.uint8))
    broadcast_array(pg, payload, root, "broadcast_object_list")
    if pg.rank != root:
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        object_list[:] = [pickle.loads(payload[offsets[i]:offsets[i + 1]].tobytes())
                          for i in range(len(object_list))]
    return object_list
