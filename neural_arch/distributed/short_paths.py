"""Short paths for the commonest collectives: a synchronous all-reduce or broadcast of a NumPy
array on the default group, with no profiler attached.

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
_BROADCAST_DTYPES: dict = {}  # dtype -> its name, for the dtypes collectives support
_BROADCAST_NAMES: dict = {}   # root -> the fingerprint's operation name


def _plan(dtype: np.dtype, op: ReduceOp) -> Optional[tuple]:
    try:
        check_dtype_for_op(dtype, op)
    except (TypeError, ValueError):
        return None  # the general path raises the error
    average = op is ReduceOp.AVERAGE
    plan = _PLANS[(dtype, op)] = (f"all_reduce:{OP_CODE[op]}", dtype.name,
                                  ReduceOp.SUM if average else op, average)
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
    name, dtype_name, run_op, average = plan
    fp = Fingerprint(name, pg._next_seq(), dtype_name, arr.size, pg.group_id)
    buf = arr if arr.ndim == 1 else arr.reshape(-1)
    pg.run_now(algorithms.all_reduce, "all_reduce", fp.seq, pg.transport, buf, run_op, fp)
    if average:
        np.divide(buf, buf.dtype.type(pg.size), out=buf)
    return arr


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
    dtype_name = _BROADCAST_DTYPES.get(arr.dtype)
    if dtype_name is None:
        if arr.dtype.type not in SUPPORTED_DTYPES:
            return None
        dtype_name = _BROADCAST_DTYPES[arr.dtype] = arr.dtype.name
    name = _BROADCAST_NAMES.get(src) or _BROADCAST_NAMES.setdefault(src, f"broadcast:{src}")
    fp = Fingerprint(name, pg._next_seq(), dtype_name, arr.size, pg.group_id)
    buf = arr if arr.ndim == 1 else arr.reshape(-1)
    pg.run_now(algorithms.broadcast, "broadcast", fp.seq, pg.transport, buf, src, fp)
    return arr
