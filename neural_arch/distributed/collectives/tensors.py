"""The public collectives, with PyTorch's signatures and semantics.

Each call validates its arguments on the calling thread (errors name the offending values),
takes the group's next sequence number, and runs the chosen algorithm on flat contiguous
buffers, now or, with ``async_op=True``, on the group's queue. Tensors are changed in place and
returned. ``src``/``dst`` are global ranks, as in PyTorch. The collectives with a root rank
(``reduce``, ``gather``, ``scatter``) are in ``rooted``; the package re-exports both.

A synchronous all-reduce or broadcast of a NumPy array, or a barrier, on the default group
with no profiler attached first looks up its *entry* in the group's short calls
(``world.short_calls``): one dictionary lookup keyed by dtype, element count and op (or root).
On shared memory (``short_calls`` of the transport) an entry exists once an earlier call of
that shape made its plan, and runs the call in one compiled step; on another transport
(``group.short_calls``) the first call of a shape makes it, after the checks the general path
makes of what the shape tells (dtype, op, root), and runs through it the algorithm the general
path would choose. Either uses the sequence number and fingerprint the general path would use
and runs after any queued async work. A synchronous all-gather into a tensor and a
reduce-scatter of a tensor look up their entries the same way (on shared memory,
``two_array_calls``: a small all-gather's compiled plan in one call, a small reduce-scatter
the compiled call of the all-reduce plan the transport runs on a copy). On a 4-byte vector
the checks and layers of the general path cost several times the collective itself. Every
other call, and every one with arguments the general path must check, goes the general way.
"""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from .. import algorithms, profiler
from ..buffers import Flat, checked_array, wrap_like
from .args import check_algorithm, tensor_list, unpack_blocks, usable_group
from ..group import world
from ..group.world import ProcessGroup
from ..transports.entry_table import declined
from ..reduce_ops import OP_CODE, SUPPORTED_DTYPES, ReduceOp, as_reduce_op

# The short calls of the default group's transport, once a call found them (see
# ``_short_calls``): starts empty, and is emptied when that transport closes.
_short: Any = SimpleNamespace(all_reduce={}, broadcast={}, all_gather={}, reduce_scatter={},
                              barrier=None, all_reduce_now=declined, broadcast_now=declined,
                              barrier_now=declined, all_gather_now=declined)


def _short_calls() -> Any:
    """The short calls of the default group, bound to it, or None where there are none (not
    initialised, one rank, closed) or a profiler wants to see every call. Only asked when a
    call found no entry and the default group may have them (``world.has_short_calls()``):
    a group without them costs that one question, not this whole chain."""
    global _short
    if profiler.current_tracer() is not None:
        return None
    short = world.short_calls()
    if short is None:
        return None
    _short = short
    return short


def all_reduce(tensor: Any, op: Any = ReduceOp.SUM, group: Optional[ProcessGroup] = None,
               async_op: bool = False, algorithm: Optional[str] = None):
    """Reduce ``tensor`` over the group, in place on every rank; returns ``tensor``."""
    if group is None and not async_op and algorithm is None and profiler.TRACER is None:
        if _short.all_reduce_now(tensor, op):
            return tensor
        entry = (_short.all_reduce.get((tensor.dtype, tensor.size, op))
                 if type(tensor) is np.ndarray and type(op) is ReduceOp else False)
        if (entry is None and world.has_short_calls()
                and algorithms.environment_choice() is None):
            short = _short_calls()
            entry = short and short.all_reduce_entry(tensor, op, OP_CODE[op])
        if entry and entry(tensor):
            return tensor
    pg = usable_group(group, "all_reduce")
    op = as_reduce_op(op)
    arr = checked_array(tensor, "all_reduce tensor", op, writable=True)
    tag = check_algorithm("all_reduce", algorithm, pg)
    fp = pg.fingerprint(f"all_reduce{tag}:{OP_CODE[op]}", arr.dtype, arr.size)

    def run():
        flat = Flat(arr)
        algorithms.all_reduce(pg.transport, flat.buf, op, fp, algorithm)
        flat.commit()
        return tensor
    return pg.run(run, async_op, fp, "all_reduce")


def broadcast(tensor: Any, src: int = 0, group: Optional[ProcessGroup] = None,
              async_op: bool = False, algorithm: Optional[str] = None):
    """Copy ``tensor`` of rank ``src`` into ``tensor`` of every rank; returns ``tensor``."""
    if group is None and not async_op and algorithm is None and profiler.TRACER is None:
        if _short.broadcast_now(tensor, src):
            return tensor
        entry = (_short.broadcast.get((tensor.dtype, tensor.size, src))
                 if type(tensor) is np.ndarray and type(src) is int else False)
        if entry is None and world.has_short_calls() and tensor.dtype.type in SUPPORTED_DTYPES:
            short = _short_calls()
            entry = short and short.broadcast_entry(tensor, src)
        if entry and entry(tensor):
            return tensor
    pg = usable_group(group, "broadcast")
    root = pg.group_rank_of(src, "src")
    arr = checked_array(tensor, "broadcast tensor", writable=pg.rank != root)
    tag = check_algorithm("broadcast", algorithm, pg)
    fp = pg.fingerprint(f"broadcast{tag}:{root}", arr.dtype, arr.size)

    def run():
        flat = Flat(arr)
        algorithms.broadcast(pg.transport, flat.buf, root, fp, algorithm)
        if pg.rank != root:
            flat.commit()
        return tensor
    return pg.run(run, async_op, fp, "broadcast")


def all_gather(tensor_list_or_tensor: Any, tensor: Any = None,
               group: Optional[ProcessGroup] = None, async_op: bool = False,
               algorithm: Optional[str] = None):
    """``all_gather(tensor) -> list`` or PyTorch's ``all_gather(tensor_list, tensor)``."""
    pg = usable_group(group, "all_gather")
    if tensor is None:
        if isinstance(tensor_list_or_tensor, (list, tuple)):
            raise TypeError("all_gather(tensor_list, tensor) needs the tensor to send; "
                            "all_gather(tensor) returns a new list")
        source, outputs = tensor_list_or_tensor, None
    else:
        source = tensor
    arr = checked_array(source, "all_gather tensor")
    if tensor is not None:
        outputs = tensor_list(tensor_list_or_tensor, "all_gather tensor_list", arr, pg.size)
    tag = check_algorithm("all_gather", algorithm, pg)
    fp = pg.fingerprint(f"all_gather{tag}", arr.dtype, arr.size)

    def run():
        gathered = np.empty(pg.size * arr.size, dtype=arr.dtype)
        algorithms.all_gather(pg.transport, Flat(arr).buf, gathered, fp, algorithm)
        return unpack_blocks(gathered.reshape(pg.size, *arr.shape), outputs, source,
                             tensor_list_or_tensor)
    return pg.run(run, async_op, fp, "all_gather")


def all_gather_into_tensor(output_tensor: Any, input_tensor: Any,
                           group: Optional[ProcessGroup] = None, async_op: bool = False,
                           algorithm: Optional[str] = None):
    """``output_tensor`` (group size x input elements) gets every rank's input in rank order."""
    if group is None and not async_op and algorithm is None and profiler.TRACER is None:
        if _short.all_gather_now(input_tensor, output_tensor):
            return output_tensor
        out, src = output_tensor, input_tensor
        entry = (_short.all_gather.get((src.dtype, src.size))
                 if type(out) is np.ndarray and type(src) is np.ndarray else False)
        if entry is None and world.has_short_calls() and src.dtype.type in SUPPORTED_DTYPES:
            short = _short_calls()
            entry = short and short.all_gather_entry(src)
        if entry and entry(src, out):
            return out
    pg = usable_group(group, "all_gather_into_tensor")
    src = checked_array(input_tensor, "all_gather_into_tensor input")
    out = checked_array(output_tensor, "all_gather_into_tensor output", writable=True)
    if out.dtype != src.dtype or out.size != pg.size * src.size:
        raise ValueError(f"all_gather_into_tensor output must hold {pg.size} x {src.size} "
                         f"elements of {src.dtype}, got shape {out.shape} of {out.dtype}")
    tag = check_algorithm("all_gather", algorithm, pg)
    fp = pg.fingerprint(f"all_gather{tag}", src.dtype, src.size)

    def run():
        flat = Flat(out)
        algorithms.all_gather(pg.transport, Flat(src).buf, flat.buf, fp, algorithm)
        flat.commit()
        return output_tensor
    return pg.run(run, async_op, fp, "all_gather_into_tensor")


def _reduce_scatter_flat(pg: ProcessGroup, inputs: list[np.ndarray], out: np.ndarray,
                         op: ReduceOp, async_op: bool, result: Any, algorithm: Optional[str]):
    tag = check_algorithm("reduce_scatter", algorithm, pg)
    fp = pg.fingerprint(f"reduce_scatter{tag}:{OP_CODE[op]}", out.dtype,
                        sum(a.size for a in inputs))

    def run():
        flat = Flat(out)
        send = Flat(inputs[0]).buf if len(inputs) == 1 else np.concatenate(
            [Flat(a).buf for a in inputs])
        algorithms.reduce_scatter(pg.transport, send, flat.buf, op, fp, algorithm)
        flat.commit()
        return result() if callable(result) else result
    return pg.run(run, async_op, fp, "reduce_scatter")


def reduce_scatter(output: Any, input_list: Any = None, op: Any = ReduceOp.SUM,
                   group: Optional[ProcessGroup] = None, async_op: bool = False,
                   algorithm: Optional[str] = None):
    """``reduce_scatter(tensor, op) -> this rank's chunk`` (split along the first dimension),
    or PyTorch's ``reduce_scatter(output, input_list, op)`` filling ``output``."""
    pg = usable_group(group, "reduce_scatter")
    if input_list is None or isinstance(input_list, (ReduceOp, str)):
        op = as_reduce_op(op if input_list is None else input_list)
        arr = checked_array(output, "reduce_scatter tensor", op)
        if arr.ndim == 0 or arr.shape[0] % pg.size:
            raise ValueError(f"reduce_scatter splits the first dimension over {pg.size} ranks; "
                             f"shape {arr.shape} does not divide evenly")
        chunk = np.empty((arr.shape[0] // pg.size,) + arr.shape[1:], dtype=arr.dtype)
        # Wrapped only once filled: for a device tensor, wrapping copies the chunk to the device.
        return _reduce_scatter_flat(pg, [arr], chunk, op, async_op,
                                    lambda: wrap_like(output, chunk), algorithm)
    op = as_reduce_op(op)
    out = checked_array(output, "reduce_scatter output", op, writable=True)
    inputs = tensor_list(input_list, "reduce_scatter input_list", out, pg.size, False)
    return _reduce_scatter_flat(pg, inputs, out, op, async_op, output, algorithm)


def reduce_scatter_tensor(output: Any, input: Any, op: Any = ReduceOp.SUM,
                          group: Optional[ProcessGroup] = None, async_op: bool = False,
                          algorithm: Optional[str] = None):
    """PyTorch's tensor form: ``input`` holds group size x ``output`` elements."""
    if (group is None and not async_op and algorithm is None and type(input) is np.ndarray
            and type(output) is np.ndarray and type(op) is ReduceOp
            and profiler.TRACER is None):
        entry = _short.reduce_scatter.get((input.dtype, input.size, op))
        if entry is None and world.has_short_calls():
            short = _short_calls()
            entry = short and short.reduce_scatter_entry(input, op, OP_CODE[op])
        if entry and entry(input, output):
            return output
    pg = usable_group(group, "reduce_scatter")
    op = as_reduce_op(op)
    out = checked_array(output, "reduce_scatter_tensor output", op, writable=True)
    src = checked_array(input, "reduce_scatter_tensor input", op)
    if src.dtype != out.dtype or src.size != pg.size * out.size:
        raise ValueError(f"reduce_scatter_tensor input must hold {pg.size} x {out.size} "
                         f"elements of {out.dtype}, got shape {src.shape} of {src.dtype}")
    return _reduce_scatter_flat(pg, [src], out, op, async_op, output, algorithm)


def barrier(group: Optional[ProcessGroup] = None, async_op: bool = False,
            device_ids: Any = None, algorithm: Optional[str] = None):
    """Return only once every rank of the group has entered the barrier."""
    if group is None and not async_op and algorithm is None and profiler.TRACER is None:
        if _short.barrier_now():
            return None
        entry = _short.barrier
        if entry is None and world.has_short_calls():
            short = _short_calls()
            entry = short and short.barrier_entry()
        if entry:
            entry()
            return None
    pg = usable_group(group, "barrier")
    tag = check_algorithm("barrier", algorithm, pg)
    fp = pg.fingerprint(f"barrier{tag}", np.uint8, 0)

    def run() -> None:
        algorithms.barrier(pg.transport, fp, algorithm)
    return pg.run(run, async_op, fp, "barrier")

__all__ = ["all_gather", "all_gather_into_tensor", "all_reduce", "barrier", "broadcast",
           "reduce_scatter", "reduce_scatter_tensor"]
