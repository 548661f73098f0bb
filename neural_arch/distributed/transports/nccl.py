"""NCCL transport: messages and collectives between GPUs through CuPy's NCCL binding.

Rendezvous: rank 0 draws NCCL's unique id and publishes it in the job's store; the other ranks
read it (bounded by the timeout), all meet at a store barrier, and the communicator is created
in a separate thread, so a rank that never arrives ends in RendezvousError instead of a hang.
Each rank drives one GPU: ``device`` if given, else LOCAL_RANK (or the rank) modulo the number
of visible devices. NCCL refuses two ranks of one communicator on the same GPU.

The collectives layer hands transports host NumPy buffers: ``send``/``recv``/``sendrecv`` copy
them through a device staging buffer. Every message is a header (the collective's fingerprint)
then the payload, as on the other transports, so mismatched collectives are detected.
``native_collectives()`` runs NCCL's own collectives, on NumPy buffers (staged) or directly on
CuPy arrays in place. Waits poll the transport's CUDA stream against the timeout; on timeout or
an asynchronous NCCL error the communicator is aborted and the error names rank, peer,
operation and sequence number.
"""
from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional

import numpy as np

from ..errors import (CollectiveMismatchError, CollectiveTimeoutError, PeerFailureError,
                      RendezvousError)
from ..reduce_ops import ReduceOp, as_reduce_op, check_dtype_for_op
from .base import HEADER_SIZE, Fingerprint, Transport, check_header, pack_header, unpack_header

if TYPE_CHECKING:
    from .nccl_collectives import NcclCollectives

UNIQUE_ID_KEY = "neural_arch/nccl/unique_id"
_ARRIVAL_KEY = "neural_arch/nccl/arrival"
_OPS = {ReduceOp.SUM: "NCCL_SUM", ReduceOp.AVERAGE: "NCCL_SUM", ReduceOp.PRODUCT: "NCCL_PROD",
        ReduceOp.MIN: "NCCL_MIN", ReduceOp.MAX: "NCCL_MAX"}
_DTYPES = {"float16": "NCCL_FLOAT16", "float32": "NCCL_FLOAT32", "float64": "NCCL_FLOAT64",
           "int32": "NCCL_INT32", "int64": "NCCL_INT64", "uint8": "NCCL_UINT8"}


def _import() -> tuple:
    try:
        import cupy
        from cupy.cuda import nccl
    except ImportError as exc:
        raise ImportError("the 'nccl' backend needs CuPy built with NCCL "
                          f"(pip install cupy-cuda12x), or choose 'shm', 'tcp' or 'mpi' ({exc})"
                          ) from exc
    if not getattr(nccl, "available", False):
        raise ImportError("CuPy is installed but could not load the NCCL library; install "
                          "nvidia-nccl-cu12 or choose backend 'shm', 'tcp' or 'mpi'")
    return cupy, nccl


def is_available() -> bool:
    """True when CuPy imports with NCCL and at least one GPU answers."""
    try:
        cupy, _ = _import()
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no CuPy, no NCCL, or no driver: the backend is simply absent
        return False


def create(rank: int, world_size: int, store: Any, timeout: float = 1800.0,
           device: Optional[int] = None) -> "NcclTransport":
    return NcclTransport(rank, world_size, store, timeout, device)


def _is_device_array(buf: Any) -> bool:
    return type(buf).__module__.split(".", 1)[0] == "cupy"


def _unique_id_candidates(raw: bytes) -> List[Any]:
    """NCCL's id in each form some CuPy takes: bytes (CuPy 14), or a tuple of C chars, signed
    or unsigned by platform (older CuPy)."""
    return [raw, tuple(b - 256 if b > 127 else b for b in raw), tuple(raw)]


class NcclTransport(Transport):
    name = "nccl"

    def __init__(self, rank: int, world_size: int, store: Any, timeout: float = 1800.0,
                 device: Optional[int] = None) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        super().__init__(rank, world_size, float(timeout))
        self._cp, self._nccl = _import()
        count = self._cp.cuda.runtime.getDeviceCount()
        index = device if device is not None else int(os.environ.get("LOCAL_RANK", rank)) % count
        if not 0 <= index < count:
            raise ValueError(f"rank {rank}: GPU index {index} is outside [0, {count})")
        self.device = self._cp.cuda.Device(index)
        self._lock = threading.RLock()
        self._broken: Optional[str] = None
        self._scratch: dict = {}
        self._native_seq = 0
        with self.device:
            self._stream = self._cp.cuda.Stream(non_blocking=True)
            self._comm = self._connect(store)

    # ---- set-up ------------------------------------------------------------------------------
    def _connect(self, store: Any) -> Any:
        where = dict(rank=self.rank, op="nccl.init")
        if self.rank == 0:
            store.set(UNIQUE_ID_KEY, bytes(v & 0xFF for v in self._nccl.get_unique_id()))
        raw = store.get(UNIQUE_ID_KEY, timeout=self.timeout)
        if len(raw) != 128:
            raise RendezvousError(f"NCCL unique id in the store has {len(raw)} bytes, not 128",
                                  **where)
        from ..rendezvous.store import barrier as store_barrier
        store_barrier(store, _ARRIVAL_KEY, self.world_size, self.rank, self.timeout)
        outcome: dict = {}

        def init() -> None:
            with self.device:
                for candidate in _unique_id_candidates(raw):
                    try:
                        outcome["comm"] = self._nccl.NcclCommunicator(self.world_size, candidate,
                                                                      self.rank)
                        return
                    except (TypeError, OverflowError) as exc:  # another CuPy's id form
                        outcome["error"] = exc
                        continue
                    except Exception as exc:  # NcclError: reported on the caller's thread
                        outcome["error"] = exc
                        return

        thread = threading.Thread(target=init, name=f"nccl-init-rank-{self.rank}", daemon=True)
        thread.start()
        thread.join(self.timeout)
        if thread.is_alive():
            raise RendezvousError(f"the NCCL communicator of {self.world_size} ranks did not "
                                  f"form within {self.timeout} s", **where)
        if "comm" not in outcome:
            raise RendezvousError(f"NCCL could not create the communicator on GPU "
                                  f"{self.device.id}: {outcome.get('error')}", **where)
        return outcome["comm"]

    # ---- staging and waiting -----------------------------------------------------------------
    def _device_bytes(self, name: str, nbytes: int) -> Any:
        """A device uint8 scratch buffer of at least ``nbytes`` (grown, never shrunk)."""
        buf = self._scratch.get(name)
        if buf is None or buf.size < nbytes:
            buf = self._scratch[name] = self._cp.empty(max(nbytes, 1), dtype=self._cp.uint8)
        return buf[:nbytes]

    def _to_device(self, name: str, host: np.ndarray) -> Any:
        raw = host.reshape(-1).view(np.uint8)
        dev = self._device_bytes(name, raw.nbytes)
        if raw.nbytes:
            dev.set(raw, stream=self._stream)
        return dev

    def _to_host(self, dev: Any, host: np.ndarray) -> None:
        if host.nbytes:
            dev.get(stream=self._stream, out=host.reshape(-1).view(np.uint8))
            self._stream.synchronize()  # the NCCL work before it has already completed

    def _check_usable(self, fp: Fingerprint, peer: Optional[int] = None) -> None:
        if self._comm is None or self._broken is not None:
            raise PeerFailureError(f"NCCL transport unusable: {self._broken or 'closed'}",
                                   rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)

    def _wait(self, fp: Fingerprint, peers: List[int]) -> None:
        """Poll the stream until the queued NCCL work is done; abort on timeout or error."""
        deadline = time.monotonic() + self.timeout
        peer = peers[0] if len(peers) == 1 else None
        polls = 0
        while not self._stream.done:
            try:
                self._comm.check_async_error()
            except Exception as exc:  # NcclError from a dead or misbehaving peer
                self._abort(f"NCCL error in {fp.describe()}: {exc}")
                raise PeerFailureError(f"NCCL reported {exc} during {fp.describe()}",
                                       rank=self.rank, peer=peer, op=fp.op, seq=fp.seq) from None
            if time.monotonic() > deadline:
                self._abort(f"timeout in {fp.describe()}")
                raise CollectiveTimeoutError(
                    f"{fp.describe()} did not complete within {self.timeout} s"
                    + (f" (waiting on rank(s) {peers})" if peers else ""), rank=self.rank,
                    peer=peer, op=fp.op, seq=fp.seq)
            polls += 1
            if polls > 64:  # spin briefly for latency, then stop burning a shared core
                time.sleep(min(1e-3, 1e-6 * (polls - 64)))

    def _abort(self, why: str) -> None:
        self._broken = why
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abort()

    def _nccl_type(self, dtype: Any) -> int:
        name = np.dtype(dtype).name
        if name not in _DTYPES:
            raise TypeError(f"NCCL transport cannot carry dtype {name}; use one of "
                            f"{sorted(_DTYPES)}")
        return getattr(self._nccl, _DTYPES[name])

    # ---- point to point ----------------------------------------------------------------------
    def _check_peer(self, peer: int, fp: Fingerprint) -> None:
        self.check_peer_rank(peer, fp)
        self._check_usable(fp, peer)

    def _exchange(self, fp: Fingerprint, sends: list, recvs: list, peers: List[int]) -> None:
        """One NCCL group of sends [(device bytes, dst)] and recvs [(device bytes, src)]."""
        u8, stream = self._nccl.NCCL_UINT8, self._stream.ptr
        self._nccl.groupStart()
        try:
            for dev, dst in sends:
                self._comm.send(dev.data.ptr, dev.size, u8, int(dst), stream)
            for dev, src in recvs:
                self._comm.recv(dev.data.ptr, dev.size, u8, int(src), stream)
        finally:
            self._nccl.groupEnd()
        self._wait(fp, peers)

    def _checked_header(self, dev: Any, src: int, fp: Fingerprint, nbytes: int) -> None:
        raw = np.empty(HEADER_SIZE, np.uint8)
        self._to_host(dev, raw)
        try:
            got, got_bytes = unpack_header(raw.tobytes())
            check_header(fp, got, got_bytes, nbytes, rank=self.rank, peer=src)
        except (ValueError, CollectiveMismatchError) as exc:
            # The peer may now block sending a payload nobody receives: this link is done.
            self._abort(f"bad header from rank {src} in {fp.describe()}")
            if isinstance(exc, CollectiveMismatchError):
                raise
            raise CollectiveMismatchError(f"peer rank {src} sent a malformed header ({exc}) "
                                          f"while we expected {fp.describe()}", rank=self.rank,
                                          peer=src, op=fp.op, seq=fp.seq) from None

    def _header(self, fp: Fingerprint, nbytes: int) -> np.ndarray:
        return np.frombuffer(pack_header(fp, nbytes), dtype=np.uint8)

    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        with self._lock, self.device:
            self._check_peer(dst, fp)
            self._exchange(fp, [(self._to_device("head_out", self._header(fp, buf.nbytes)),
                                 dst)], [], [dst])
            if buf.nbytes:
                self._exchange(fp, [(self._to_device("out", buf), dst)], [], [dst])

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        with self._lock, self.device:
            self._check_peer(src, fp)
            head = self._device_bytes("head_in", HEADER_SIZE)
            self._exchange(fp, [], [(head, src)], [src])
            self._checked_header(head, src, fp, buf.nbytes)
            if buf.nbytes:
                dev = self._device_bytes("in", buf.nbytes)
                self._exchange(fp, [], [(dev, src)], [src])
                self._to_host(dev, buf)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        with self._lock, self.device:
            self._check_peer(dst, fp)
            self._check_peer(src, fp)
            head_out = self._to_device("head_out", self._header(fp, sendbuf.nbytes))
            head_in = self._device_bytes("head_in", HEADER_SIZE)
            self._exchange(fp, [(head_out, dst)], [(head_in, src)], [src, dst])
            self._checked_header(head_in, src, fp, recvbuf.nbytes)
            sends = [(self._to_device("out", sendbuf), dst)] if sendbuf.nbytes else []
            dev_in = self._device_bytes("in", recvbuf.nbytes)
            recvs = [(dev_in, src)] if recvbuf.nbytes else []
            if sends or recvs:
                self._exchange(fp, sends, recvs, [src, dst])
            self._to_host(dev_in, recvbuf)

    def native_collectives(self) -> "NcclCollectives":
        from .nccl_collectives import NcclCollectives
        return NcclCollectives(self)

    def run_collective(self, name: str, dtype: Any, count: int,
                       launch: Callable[[int], None]) -> None:
        """Queue ``launch(stream_ptr)`` (NCCL calls) on the transport's stream and wait."""
        with self._lock, self.device:
            self._native_seq += 1
            fp = Fingerprint(name, self._native_seq, np.dtype(dtype).name, int(count))
            self._check_usable(fp)
            launch(self._stream.ptr)
            self._wait(fp, [])

    def close(self) -> None:
        """Destroy the communicator (abort it when it was left broken). Safe to call twice."""
        with self._lock:
            comm, self._comm = self._comm, None
            self._scratch.clear()
            if comm is not None:
                with self.device:
                    comm.destroy()


def check_reduction(dtype: Any, op: Any) -> ReduceOp:
    op = as_reduce_op(op)
    check_dtype_for_op(np.dtype(dtype), op)
    return op


__all__ = ["NcclTransport", "UNIQUE_ID_KEY", "check_reduction", "create", "is_available"]
