"""Horovod's tensor collectives on our own: allreduce, allgather, broadcast, their ``_async``
and in-place ``_`` forms (``handles``: ``synchronize``/``poll`` on what the async ones return).

Tensors are NumPy arrays or ``neural_arch.core.Tensor``s; a result is of the same kind. As in
Horovod, ``allreduce``/``broadcast`` return a new tensor and the ``_`` forms write into theirs.
Each call first runs an agreement round (``join``), so ranks inside ``hvd.join()`` can answer.
A call with a ``name`` is matched with the same name on every rank, whatever the order the
ranks submit them in: it starts once every rank has submitted it (``negotiation``); a call
without one starts at once. ``allgather`` takes a different first dimension on every rank:
the round carries each rank's row count, every rank sends its rows padded to the largest
count, and the padding is cut off.
"""
from __future__ import annotations

from typing import Any, Optional

import numpy as np

from .. import distributed as dist
from ..core import Tensor
from . import basics, negotiation, rounds
from .compression import Average, Compression, check_compression, resolve_op
from .handles import Handle


def _array(tensor: Any, what: str) -> np.ndarray:
    basics._layout()  # "not initialized" comes first, as in Horovod
    arr = tensor.array if isinstance(tensor, Tensor) else tensor
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"hvd.{what} needs a NumPy array or a neural_arch Tensor holding one, "
                        f"got {type(tensor).__name__}")
    rounds.dtype_code(arr.dtype)  # TypeError for dtypes the collectives do not carry
    return arr


def _result(tensor: Any, out: np.ndarray, inplace: bool) -> Any:
    if inplace:
        (tensor.array if isinstance(tensor, Tensor) else tensor)[...] = out
        return tensor
    return Tensor(out) if isinstance(tensor, Tensor) else out


def _check_process_set(process_set: Any, what: str) -> None:
    if process_set is not None:
        raise NotImplementedError(f"hvd.{what}(process_set=...): Horovod process sets are not "
                                  "supported; every operation runs on all ranks")


# -- allreduce -------------------------------------------------------------------------------
def prepare_allreduce(arr: np.ndarray, op: Any, compression: Any, prescale: float,
                      postscale: float, what: str):
    """Check the arguments and make the flat buffer to send (prescaled, compressed, a copy);
    returns (wire, ctx) for ``launch_allreduce``."""
    if op is Average and arr.dtype.kind != "f":
        raise TypeError(f"hvd.{what}: op=hvd.Average needs a floating tensor, got dtype "
                        f"{arr.dtype}; use op=hvd.Sum")
    if (prescale != 1.0 or postscale != 1.0) and arr.dtype.kind != "f":
        raise TypeError(f"hvd.{what}: prescale_factor/postscale_factor need a floating tensor, "
                        f"got dtype {arr.dtype}")
    send = arr * arr.dtype.type(prescale) if prescale != 1.0 else arr
    wire, ctx = compression.compress(send)
    return np.array(wire, copy=True, order="C").reshape(-1), ctx  # never the caller's storage


def launch_allreduce(wire: np.ndarray, ctx: Any, shape: tuple, dtype: np.dtype, op: Any,
                     compression: Any, postscale: float,
                     pending: Optional[rounds.PendingRound] = None):
    """Start the sum of ``wire``; returns (works, finish) where ``finish()`` gives the reduced
    array in ``dtype`` and ``shape``. ``pending``: the round this all-reduce belongs to (a
    DistributedOptimizer step runs one round for all of its gradients); by default the
    all-reduce runs a round of its own."""
    if pending is None:
        pending = rounds.start_round(rounds.ALLREDUCE, count=wire.size,
                                     dtype=rounds.dtype_code(wire.dtype))
    work = dist.all_reduce(wire, async_op=True)

    def finish() -> np.ndarray:
        contributors = pending.result().active
        work.wait()
        out = compression.decompress(wire, ctx).astype(dtype, copy=False)
        factor = postscale / contributors if op is Average else postscale
        if factor != 1.0:
            out = out * out.dtype.type(factor)
        return out.reshape(shape)
    return [work], finish


def start_allreduce(arr: np.ndarray, op: Any, compression: Any, prescale: float,
                    postscale: float, what: str, pending: Optional[rounds.PendingRound] = None):
    """``prepare_allreduce`` and ``launch_allreduce`` at once."""
    wire, ctx = prepare_allreduce(arr, op, compression, prescale, postscale, what)
    return launch_allreduce(wire, ctx, arr.shape, arr.dtype, op, compression, postscale,
                            pending)


def _allreduce(tensor, average, name, compression, op, prescale_factor, postscale_factor,
               process_set, inplace: bool, what: str) -> Handle:
    _check_process_set(process_set, what)
    op = resolve_op(op, average, what)
    check_compression(compression, f"hvd.{what}")
    arr = _array(tensor, what)
    postscale = float(postscale_factor)
    wire, ctx = prepare_allreduce(arr, op, compression, float(prescale_factor), postscale, what)

    def launch():
        works, finish = launch_allreduce(wire, ctx, arr.shape, arr.dtype, op, compression,
                                         postscale)
        return works, lambda: _result(tensor, finish(), inplace)
    return Handle(negotiation.submit(what, name, rounds.ALLREDUCE, launch))


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=None, compression=Compression.none):
    return _allreduce(tensor, average, name, compression, op, prescale_factor,
                      postscale_factor, process_set, False, "allreduce_async")


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=None, compression=Compression.none):
    return _allreduce(tensor, average, name, compression, op, prescale_factor,
                      postscale_factor, process_set, True, "allreduce_async_")


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0, process_set=None):
    """The average (or sum) of ``tensor`` over the ranks, as a new tensor."""
    return _allreduce(tensor, average, name, compression, op, prescale_factor,
                      postscale_factor, process_set, False, "allreduce").wait()


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=None, compression=Compression.none):
    """``allreduce`` written into ``tensor``; returns it."""
    return _allreduce(tensor, average, name, compression, op, prescale_factor,
                      postscale_factor, process_set, True, "allreduce_").wait()


def _mirror_allreduce(rnd: rounds.Round) -> None:
    dist.all_reduce(np.zeros(rnd.fields["count"], dtype=rnd.dtype))


# -- allgather -------------------------------------------------------------------------------
def allgather_async(tensor, name=None, process_set=None) -> Handle:
    _check_process_set(process_set, "allgather_async")
    arr = _array(tensor, "allgather")
    if arr.ndim == 0:
        raise ValueError("hvd.allgather concatenates along the first dimension; got a 0-d "
                         "tensor (reshape it to (1,) first)")
    rows, row = arr.shape[0], int(np.prod(arr.shape[1:], dtype=np.int64))
    mine = np.array(arr, copy=True, order="C").reshape(-1)

    def launch():
        # No root in an allgather: that field carries the number of dimensions, so ranks
        # whose tensors differ in more than the first dimension are told so.
        rnd = rounds.agree(rounds.ALLGATHER, count=row, dtype=rounds.dtype_code(arr.dtype),
                           root=arr.ndim, value=rows)
        longest = max(rnd.values)
        if longest * row == 0:  # every rank agreed: nothing to send
            out = np.zeros((sum(rnd.values),) + arr.shape[1:], dtype=arr.dtype)
            return [], lambda: _result(tensor, out, False)
        padded = np.zeros(longest * row, dtype=arr.dtype)
        padded[:rows * row] = mine
        work = dist.all_gather(padded, async_op=True)

        def finish():
            blocks = work.result()
            parts = [np.asarray(b)[:n * row] for b, n in zip(blocks, rnd.values)]
            return _result(tensor, np.concatenate(parts).reshape((-1,) + arr.shape[1:]), False)
        return [work], finish
    return Handle(negotiation.submit("allgather", name, rounds.ALLGATHER, launch))


def allgather(tensor, name=None, process_set=None):
    """Every rank's ``tensor`` concatenated along dimension 0, in rank order; first
    dimensions may differ between ranks (the trailing ones may not)."""
    return allgather_async(tensor, name, process_set).wait()


def _mirror_allgather(rnd: rounds.Round) -> None:
    longest, row = max(rnd.values), rnd.fields["count"]
    if longest * row:
        dist.all_gather(np.zeros(longest * row, dtype=rnd.dtype))


# -- broadcast -------------------------------------------------------------------------------
def check_root(root_rank: Any, what: str) -> int:
    size = basics.size()
    if isinstance(root_rank, bool) or not isinstance(root_rank, (int, np.integer)) or not (
            0 <= root_rank < size):
        raise ValueError(f"hvd.{what}: root_rank must be a rank in [0, {size}), got {root_rank!r}")
    return int(root_rank)


def _broadcast(tensor, root_rank, name, process_set, inplace: bool, what: str) -> Handle:
    _check_process_set(process_set, what)
    arr = _array(tensor, what)
    root = check_root(root_rank, what)
    buf = np.array(arr, copy=True, order="C").reshape(-1)

    def launch():
        rnd = rounds.agree(rounds.BROADCAST, count=arr.size, dtype=rounds.dtype_code(arr.dtype),
                           root=root)
        rounds.check_root_active(rnd, root, what)
        work = dist.broadcast(buf, src=root, async_op=True)

        def finish():
            work.wait()
            return _result(tensor, buf.reshape(arr.shape), inplace)
        return [work], finish
    return Handle(negotiation.submit(what, name, rounds.BROADCAST, launch))


def broadcast_async(tensor, root_rank, name=None, process_set=None) -> Handle:
    return _broadcast(tensor, root_rank, name, process_set, False, "broadcast_async")


def broadcast_async_(tensor, root_rank, name=None, process_set=None) -> Handle:
    return _broadcast(tensor, root_rank, name, process_set, True, "broadcast_async_")


def broadcast(tensor, root_rank, name=None, process_set=None):
    """Rank ``root_rank``'s ``tensor`` on every rank, as a new tensor."""
    return _broadcast(tensor, root_rank, name, process_set, False, "broadcast").wait()


def broadcast_(tensor, root_rank, name=None, process_set=None):
    """``broadcast`` written into ``tensor``; returns it."""
    return _broadcast(tensor, root_rank, name, process_set, True, "broadcast_").wait()


def _mirror_broadcast(rnd: rounds.Round) -> None:
    root = rnd.fields["root"]
    rounds.check_root_active(rnd, root, "broadcast")
    dist.broadcast(np.zeros(rnd.fields["count"], dtype=rnd.dtype), src=root)


rounds.register_mirror(rounds.ALLREDUCE, _mirror_allreduce)
rounds.register_mirror(rounds.ALLGATHER, _mirror_allgather)
rounds.register_mirror(rounds.BROADCAST, _mirror_broadcast)
