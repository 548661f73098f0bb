"""Short paths for the commonest collectives: a synchronous all-reduce, broadcast or
all-gather (into a tensor) of NumPy arrays on the default group, with no profiler attached.

The general path in ``collectives`` validates through several small layers (group lookup,
dtype and op checks, a closure for the async queue, the tracer hook); for a 4-byte message on
shared memory those layers cost about as much as the collective itself. Here the checks that
depend only on the dtype (and op) are made once and remembered, and the rest are a few
attribute reads. Each builds the same fingerprint as the general path and runs the same
algorithm after any queued async work. Any call a short path does not handle, including every
one with bad arguments, goes the general way, which raises the errors.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from . import algorithms, process_group, profiler
from .reduce_ops import OP_CODE, SUPPORTED_DTYPES, ReduceOp, check_dtype_for_op
from .transports.base import Fingerprint

# (dtype, op) -> (fingerprint name, dtype name, the op the algorithm runs, divide at the end)
_PLANS: dict = {}
_DTYPE_NAMES: dict = {}  # dtype -> its name, for the dtypes collectives support
_BROADCAST_NAMES: dict = {}   # root -> the fingerprint's operation name


def _plan(dtype: np.dtype, op: ReduceOp) -> Optional[tuple]:
    try:
        check_dtype_for_op(dtype, op)
    except (TypeError, ValueError):
        return None  # the general path raises the error
    plan = _PLANS[(dtype, op)] = (f"all_reduce:{OP_CODE[op]}", dtype.name)
    return plan


def all_reduce(arr: np.ndarray, op: Any) -> Optional[np.ndarray]:
    """All-reduce ``arr`` in place on the default group and return it; None when this call
    needs the general path (not initialized, one rank, a tracer, an op or array it must check).
    ``arr`` must be exactly a ``np.ndarray``."""
    world = process_group._WORLD
    if world is None or profiler._TRACER is not None or type(op) is not ReduceOp:
        return None
    pg = world.default
    if pg.size == 1:
        return None
    flags = arr.flags
    if not (flags.c_contiguous and flags.writeable):
        return None
    plan = _PLANS.get((arr.dtype, op)) or _plan(arr.dtype, op)
    if plan is None:
        return None
    name, dtype_name = plan
    fp = Fingerprint(name, pg._next_seq(), dtype_name, arr.size, pg.group_id)
    buf = arr if arr.ndim == 1 else arr.reshape(-1)
    prepared = algorithms.prepared_all_reduce(pg.transport, arr.dtype, arr.size, op)
    if prepared is not None:
        pg.run_now(prepared, "all_reduce", fp.seq, buf, fp)
    else:
        pg.run_now(algorithms.all_reduce, "all_reduce", fp.seq, pg.transport, buf, op, fp)
    return arr


def _dtype_name(dtype: np.dtype) -> Optional[str]:
    if dtype.type not in SUPPORTED_DTYPES:
        return None  # the general path raises the error
    name = _DTYPE_NAMES[dtype] = dtype.name
    return name


def broadcast(arr: np.ndarray, src: Any) -> Optional[np.ndarray]:
    """Broadcast ``arr`` from global rank ``src`` in place on the default group and return it;
    None when this call needs the general path. ``arr`` must be exactly a ``np.ndarray``."""
    world = process_group._WORLD
    if world is None or profiler._TRACER is not None or type(src) is not int:
        return None
    pg = world.default
    if pg.size == 1 or not 0 <= src < pg.size:
        return None
    flags = arr.flags
    if not flags.c_contiguous or not (flags.writeable or pg.rank == src):
        return None
    dtype_name = _DTYPE_NAMES.get(arr.dtype) or _dtype_name(arr.dtype)
    if dtype_name is None:
        return None
    name = _BROADCAST_NAMES.get(src) or _BROADCAST_NAMES.setdefault(src, f"broadcast:{src}")
    fp = Fingerprint(name, pg._next_seq(), dtype_name, arr.size, pg.group_id)
    buf = arr if arr.ndim == 1 else arr.reshape(-1)
    pg.run_now(algorithms.broadcast, "broadcast", fp.seq, pg.transport, buf, src, fp)
    return arr


def all_gather_into_tensor(out: np.ndarray, src: np.ndarray) -> Optional[np.ndarray]:
    """Gather every rank's ``src`` into ``out`` (rank order) on the default group and return
    ``out``; None when this call needs the general path. Both must be exactly ``np.ndarray``."""
    world = process_group._WORLD
    if world is None or profiler._TRACER is not None:
        return None
    pg = world.default
    size = pg.size
    if size == 1 or out.dtype != src.dtype or out.size != size * src.size:
        return None
    if not (src.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return None
    dtype_name = _DTYPE_NAMES.get(src.dtype) or _dtype_name(src.dtype)
    if dtype_name is None:
        return None
    fp = Fingerprint("all_gather", pg._next_seq(), dtype_name, src.size, pg.group_id)
    pg.run_now(algorithms.all_gather, "all_gather_into_tensor", fp.seq, pg.transport,
               src if src.ndim == 1 else src.reshape(-1),
               out if out.ndim == 1 else out.reshape(-1), fp)
    return out
