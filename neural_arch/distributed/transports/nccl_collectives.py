"""NCCL's own collectives on an ``NcclTransport``: the transport's ``native_collectives()``.

Each method takes host NumPy buffers (copied to the GPU, reduced there, copied back) or CuPy
arrays on the transport's GPU (used in place: no copy at all), with the signatures of the MPI
transport's native collectives, so ``algorithm="native"`` works on either transport. AVERAGE is
a NCCL sum divided once by the world size.
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator, Optional

import numpy as np

from ..reduce_ops import ReduceOp, finish_average
from .base import Fingerprint, check_roots
from .nccl import _OPS, NcclTransport, _is_device_array, check_reduction


class NcclCollectives:
    """All-reduce, all-gather, broadcast, reduce-scatter and barrier through NCCL (``fp`` is
    accepted as every native collective takes it; NCCL orders its own operations). A broadcast
    first gathers every rank's root, so that ranks that disagree raise instead of diverging."""

    name = "native"
    preferred = False  # chosen only when asked for, as MPI's

    def __init__(self, transport: NcclTransport) -> None:
        self._t = transport

    @contextmanager
    def _on_device(self, buf: Any, slot: str, write_back: bool) -> Iterator[Any]:
        """``buf`` as a contiguous array on the transport's GPU (staged when it is NumPy),
        with the transport held for the whole operation."""
        t = self._t
        with t._lock, t.device:
            if _is_device_array(buf):
                if not buf.flags.c_contiguous or buf.device.id != t.device.id:
                    raise ValueError(f"NCCL collectives need C-contiguous arrays on GPU "
                                     f"{t.device.id}; got shape {buf.shape}, strides "
                                     f"{buf.strides} on GPU {buf.device.id}")
                yield buf
                return
            if not isinstance(buf, np.ndarray) or not buf.flags.c_contiguous:
                raise ValueError(f"NCCL collectives need a C-contiguous NumPy or CuPy array, "
                                 f"got {type(buf).__name__} {getattr(buf, 'shape', '')}")
            staged = t._to_device(slot, buf).view(buf.dtype)
            yield staged
            if write_back:
                t._to_host(staged.view(t._cp.uint8), buf)

    def _finish_average(self, buf: Any, op: ReduceOp) -> None:
        if op is ReduceOp.AVERAGE and self._t.world_size > 1:
            if _is_device_array(buf):
                with self._t.device:
                    buf /= buf.dtype.type(self._t.world_size)
            else:
                finish_average(buf, op, self._t.world_size)

    def all_reduce(self, buf: Any, op: Any = ReduceOp.SUM,
                   fp: Optional[Fingerprint] = None) -> Any:
        op = check_reduction(buf.dtype, op)
        t = self._t
        kind, code = t._nccl_type(buf.dtype), getattr(t._nccl, _OPS[op])
        with self._on_device(buf, "out", True) as dev:
            t.run_collective("nccl.all_reduce", buf.dtype, buf.size, lambda stream: t._comm
                             .allReduce(dev.data.ptr, dev.data.ptr, dev.size, kind, code, stream))
        self._finish_average(buf, op)
        return buf

    def all_gather(self, sendbuf: Any, recvbuf: Any,
                   fp: Optional[Fingerprint] = None) -> Any:
        t = self._t
        if recvbuf.size != sendbuf.size * t.world_size or recvbuf.dtype != sendbuf.dtype:
            raise ValueError(f"all_gather needs recvbuf of {sendbuf.size * t.world_size} x "
                             f"{sendbuf.dtype}, got {recvbuf.size} x {recvbuf.dtype}")
        kind = t._nccl_type(sendbuf.dtype)
        with self._on_device(sendbuf, "out", False) as src, \
                self._on_device(recvbuf, "in", True) as dst:
            t.run_collective("nccl.all_gather", sendbuf.dtype, sendbuf.size, lambda stream: t._comm
                             .allGather(src.data.ptr, dst.data.ptr, src.size, kind, stream))
        return recvbuf

    def broadcast(self, buf: Any, root: int = 0, fp: Optional[Fingerprint] = None) -> Any:
        t = self._t
        if not 0 <= root < t.world_size:
            raise ValueError(f"broadcast root {root} is outside [0, {t.world_size})")
        # NCCL's broadcast with different roots returns different data on each rank, or
        # hangs: every rank first learns every rank's root, as the portable algorithms do.
        roots = np.empty(t.world_size, np.int64)
        self.all_gather(np.array([root], np.int64), roots)
        check_roots(roots.tolist(), fp or Fingerprint(f"nccl.broadcast:{root}", 0, str(buf.dtype),
                                                      buf.size), t)
        kind = t._nccl_type(buf.dtype)
        with self._on_device(buf, "out", t.rank != root) as dev:
            t.run_collective("nccl.broadcast", buf.dtype, buf.size, lambda stream: t._comm
                             .broadcast(dev.data.ptr, dev.data.ptr, dev.size, kind, root, stream))
        return buf

    def reduce_scatter(self, sendbuf: Any, recvbuf: Any, op: Any = ReduceOp.SUM,
                       fp: Optional[Fingerprint] = None) -> Any:
        op = check_reduction(sendbuf.dtype, op)
        t = self._t
        if sendbuf.size != recvbuf.size * t.world_size or recvbuf.dtype != sendbuf.dtype:
            raise ValueError(f"reduce_scatter needs sendbuf of world_size x recvbuf elements and "
                             f"equal dtypes; got {sendbuf.size} x {sendbuf.dtype} and "
                             f"{recvbuf.size} x {recvbuf.dtype}")
        kind, code = t._nccl_type(sendbuf.dtype), getattr(t._nccl, _OPS[op])
        with self._on_device(sendbuf, "out", False) as src, \
                self._on_device(recvbuf, "in", True) as dst:
            t.run_collective("nccl.reduce_scatter", sendbuf.dtype, sendbuf.size,
                             lambda stream: t._comm.reduceScatter(src.data.ptr, dst.data.ptr,
                                                                  dst.size, kind, code, stream))
        self._finish_average(recvbuf, op)
        return recvbuf

    def barrier(self, fp: Optional[Fingerprint] = None) -> None:
        """A one-byte all-reduce: returns once every rank has queued and finished it."""
        t = self._t
        token = np.zeros(1, dtype=np.uint8)
        kind = t._nccl_type(np.uint8)
        with self._on_device(token, "barrier", False) as dev:
            t.run_collective("nccl.barrier", np.uint8, 1, lambda stream: t._comm.allReduce(
                dev.data.ptr, dev.data.ptr, 1, kind, t._nccl.NCCL_SUM, stream))


__all__ = ["NcclCollectives"]
