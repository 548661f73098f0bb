"""A stand-in for ``cupy.cuda.nccl`` between threads of one process, for CPU-only tests.

Communicators created with the same unique id form one job. "Device pointers" are host
addresses (``fake_cupy`` arrays hand out their NumPy memory), read and written with ctypes.
Sends are buffered per (source, destination) pair and complete at once; receives take from
that buffer and check the byte count, as NCCL's matching requires. Collectives meet at a
barrier, combine every rank's contribution and write each rank's result. The method names and
argument orders are those of CuPy's binding (``cupy_backends/cuda/libs/nccl.pyx``).
"""
from __future__ import annotations

import ctypes
import os
import queue
import threading
from typing import Dict, List

import numpy as np

available = True
NCCL_INT32, NCCL_INT64, NCCL_UINT8, NCCL_FLOAT16, NCCL_FLOAT32, NCCL_FLOAT64 = 2, 4, 1, 6, 7, 8
NCCL_SUM, NCCL_PROD, NCCL_MAX, NCCL_MIN = 0, 1, 2, 3
_TYPES = {NCCL_INT32: np.int32, NCCL_INT64: np.int64, NCCL_UINT8: np.uint8,
          NCCL_FLOAT16: np.float16, NCCL_FLOAT32: np.float32, NCCL_FLOAT64: np.float64}
_REDUCE = {NCCL_SUM: np.add, NCCL_PROD: np.multiply, NCCL_MAX: np.maximum, NCCL_MIN: np.minimum}
RECV_TIMEOUT_S = 10.0


class NcclError(RuntimeError):
    pass


class _Job:
    def __init__(self, size: int) -> None:
        self.size = size
        self.barrier = threading.Barrier(size, timeout=RECV_TIMEOUT_S)
        self.slots: List[np.ndarray] = [np.empty(0)] * size
        self.links: Dict[tuple, queue.Queue] = {}
        self.lock = threading.Lock()

    def link(self, src: int, dst: int) -> queue.Queue:
        with self.lock:
            return self.links.setdefault((src, dst), queue.Queue())


_jobs: Dict[bytes, _Job] = {}
_jobs_lock = threading.Lock()
_groups = threading.local()


# How this CuPy passes NCCL's unique id: CuPy 13 and older take a tuple of C chars (signed on
# x86), CuPy 14 takes bytes; each refuses the other form.
ID_FORMAT = "signed-chars"


def get_unique_id():
    raw = os.urandom(128)
    return raw if ID_FORMAT == "bytes" else tuple(b - 256 if b > 127 else b for b in raw)


def groupStart() -> None:  # noqa: N802 - CuPy's name
    _groups.depth = getattr(_groups, "depth", 0) + 1


def groupEnd() -> None:  # noqa: N802 - CuPy's name
    _groups.depth -= 1


def _read(ptr: int, count: int, datatype: int) -> np.ndarray:
    dtype = np.dtype(_TYPES[datatype])
    return np.frombuffer(ctypes.string_at(ptr, count * dtype.itemsize), dtype=dtype).copy()


def _write(ptr: int, values: np.ndarray) -> None:
    ctypes.memmove(ptr, values.ctypes.data, values.nbytes)


class NcclCommunicator:
    def __init__(self, ndev: int, commId, rank: int) -> None:  # noqa: N803
        wanted = bytes if ID_FORMAT == "bytes" else tuple
        if not isinstance(commId, wanted):
            raise TypeError(f"Argument 'commId' has incorrect type (expected "
                            f"{wanted.__name__}, got {type(commId).__name__})")
        if wanted is tuple and any(not -128 <= v <= 127 for v in commId):  # signed, as x86
            raise OverflowError("value too large to convert to char")
        key = bytes(v & 0xFF for v in commId)
        with _jobs_lock:
            self._job = _jobs.setdefault(key, _Job(ndev))
        self._rank, self.aborted = rank, False
        self._job.barrier.wait()

    def _check(self) -> None:
        if self.aborted:
            raise NcclError("communicator was aborted")

    def send(self, sendbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._check()
        self._job.link(self._rank, peer).put(_read(sendbuf, count, datatype))

    def recv(self, recvbuf: int, count: int, datatype: int, peer: int, stream: int) -> None:
        self._check()
        try:
            values = self._job.link(peer, self._rank).get(timeout=RECV_TIMEOUT_S)
        except queue.Empty:
            raise NcclError(f"rank {self._rank}: nothing arrived from rank {peer}") from None
        if values.nbytes != count * np.dtype(_TYPES[datatype]).itemsize:
            raise NcclError(f"rank {self._rank} expected {count} elements from rank {peer}, "
                            f"got {values.nbytes} bytes: unmatched send/recv")
        _write(recvbuf, values)

    def _gather(self, values: np.ndarray) -> List[np.ndarray]:
        job = self._job
        job.slots[self._rank] = values
        job.barrier.wait()
        everyone = list(job.slots)
        job.barrier.wait()
        return everyone

    def allReduce(self, sendbuf, recvbuf, count, datatype, op, stream):  # noqa: N802
        self._check()
        parts = self._gather(_read(sendbuf, count, datatype))
        result = parts[0].copy()
        for part in parts[1:]:
            _REDUCE[op](result, part, out=result)
        _write(recvbuf, result)

    def allGather(self, sendbuf, recvbuf, count, datatype, stream):  # noqa: N802
        self._check()
        _write(recvbuf, np.concatenate(self._gather(_read(sendbuf, count, datatype))))

    def broadcast(self, sendbuff, recvbuff, count, datatype, root, stream):
        self._check()
        _write(recvbuff, self._gather(_read(sendbuff, count, datatype))[root])

    def reduceScatter(self, sendbuf, recvbuf, recvcount, datatype, op, stream):  # noqa: N802
        self._check()
        parts = self._gather(_read(sendbuf, recvcount * self._job.size, datatype))
        result = parts[0].copy()
        for part in parts[1:]:
            _REDUCE[op](result, part, out=result)
        _write(recvbuf, result[self._rank * recvcount:(self._rank + 1) * recvcount])

    def check_async_error(self) -> None:
        self._check()

    def abort(self) -> None:
        self.aborted = True

    def destroy(self) -> None:
        return None
