"""MPI's own collectives on an ``MpiTransport``: the transport's ``native_collectives()``.

Each runs as a non-blocking MPI request on the transport's duplicated communicator and is polled
through the transport's ``wait_requests``, so it is bounded by the same timeout and liveness
checks as point-to-point traffic.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

import numpy as np

from ..errors import PeerFailureError
from ..reduce_ops import ReduceOp, as_reduce_op, check_dtype_for_op, finish_average
from .base import Fingerprint, check_roots

if TYPE_CHECKING:  # mpi imports this module to return MpiCollectives
    from .mpi import MpiTransport


_MPI_OPS = {ReduceOp.SUM: "SUM", ReduceOp.AVERAGE: "SUM", ReduceOp.PRODUCT: "PROD",
            ReduceOp.MIN: "MIN", ReduceOp.MAX: "MAX"}


class MpiCollectives:
    """MPI's own collectives on the transport's communicator, bounded by its timeout.

    ``fp`` (the caller's fingerprint) is accepted as every native collective takes it; MPI
    numbers its own operations and does not need it. A broadcast first gathers every rank's
    root: MPI's own broadcast with different roots hangs or returns different data."""

    name = "native"
    preferred = False  # chosen only when asked for: the portable algorithms are the default

    def __init__(self, transport: MpiTransport) -> None:
        self._t, self._seq = transport, 0

    def _run(self, name: str, request_fn, buf: Optional[np.ndarray] = None) -> None:
        t = self._t
        if t.comm is None:
            raise PeerFailureError("transport is closed", rank=t.rank, op=name)
        self._seq += 1
        fp = Fingerprint(name, self._seq, "" if buf is None else buf.dtype.str,
                         0 if buf is None else buf.size)
        t.run_collective(request_fn, fp)

    def all_reduce(self, buf: np.ndarray, op=ReduceOp.SUM,
                   fp: Optional[Fingerprint] = None) -> np.ndarray:
        op = as_reduce_op(op)
        check_dtype_for_op(buf.dtype, op)
        _check_contiguous(buf, "all_reduce")
        mpi_op = getattr(self._t.mpi, _MPI_OPS[op])
        self._run("mpi.all_reduce", lambda c: c.Iallreduce(self._t.mpi.IN_PLACE, buf, mpi_op), buf)
        finish_average(buf, op, self._t.world_size)
        return buf

    def all_gather(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                   fp: Optional[Fingerprint] = None) -> np.ndarray:
        _check_contiguous(sendbuf, "all_gather")
        _check_contiguous(recvbuf, "all_gather")
        if recvbuf.size != sendbuf.size * self._t.world_size or recvbuf.dtype != sendbuf.dtype:
            raise ValueError(f"all_gather needs recvbuf of {sendbuf.size * self._t.world_size} x "
                             f"{sendbuf.dtype}, got {recvbuf.size} x {recvbuf.dtype}")
        self._run("mpi.all_gather", lambda c: c.Iallgather(sendbuf, recvbuf), sendbuf)
        return recvbuf

    def broadcast(self, buf: np.ndarray, root: int = 0,
                  fp: Optional[Fingerprint] = None) -> np.ndarray:
        _check_contiguous(buf, "broadcast")
        if not 0 <= root < self._t.world_size:
            raise ValueError(f"broadcast root {root} is outside [0, {self._t.world_size})")
        mine, roots = np.array([root], dtype=np.int64), np.empty(self._t.world_size, np.int64)
        self._run("mpi.broadcast_root", lambda c: c.Iallgather(mine, roots), mine)
        check_roots(roots.tolist(), fp or Fingerprint(f"mpi.broadcast:{root}", self._seq,
                                                      buf.dtype.str, buf.size), self._t)
        self._run("mpi.broadcast", lambda c: c.Ibcast(buf, root), buf)
        return buf

    def reduce_scatter(self, sendbuf: np.ndarray, recvbuf: np.ndarray,
                       op=ReduceOp.SUM, fp: Optional[Fingerprint] = None) -> np.ndarray:
        op = as_reduce_op(op)
        check_dtype_for_op(sendbuf.dtype, op)
        _check_contiguous(sendbuf, "reduce_scatter")
        _check_contiguous(recvbuf, "reduce_scatter")
        if sendbuf.size != recvbuf.size * self._t.world_size or recvbuf.dtype != sendbuf.dtype:
            raise ValueError(f"reduce_scatter needs sendbuf of world_size x recvbuf elements and "
                             f"equal dtypes; got {sendbuf.size} x {sendbuf.dtype} and "
                             f"{recvbuf.size} x {recvbuf.dtype}")
        mpi_op = getattr(self._t.mpi, _MPI_OPS[op])
        self._run("mpi.reduce_scatter",
                  lambda c: c.Ireduce_scatter_block(sendbuf, recvbuf, mpi_op), sendbuf)
        finish_average(recvbuf, op, self._t.world_size)
        return recvbuf

    def barrier(self, fp: Optional[Fingerprint] = None) -> None:
        self._run("mpi.barrier", lambda c: c.Ibarrier())


def _check_contiguous(buf: np.ndarray, what: str) -> None:
    if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
        raise ValueError(f"{what} needs a C-contiguous numpy array, got "
                         f"{type(buf).__name__} {getattr(buf, 'shape', '')}")
