"""MPI transport over mpi4py, with MPI's own collectives exposed beside ours for comparison.

Traffic runs on a duplicate of the communicator so it never matches the application's own
receives. Each message is a small header message (the fingerprint) followed by the payload, on
one tag; MPI's non-overtaking rule keeps them paired. Every wait is a poll over non-blocking
requests bounded by ``timeout``.

Dead peers: Open MPI's launcher normally kills the whole job when a rank dies. When it does not,
ranks on the same host notice a peer's death within about half a second (pids and process start
times are exchanged at creation and checked while polling) and raise PeerFailureError. With
fault tolerance on (``mpiexec --with-ft ulfm``) MPI fails the requests that involve a dead rank
and names it (``Get_failed``), wherever it ran; the process group's heartbeat store
(``mpi_heartbeat``) finds ranks on other hosts that hang or are cut off.

Ranks that leave, and failures found, are told to every peer in notices (``mpi_notices``): a
rank whose program ended sits in ``MPI_Finalize``, alive, and only its notice says it left. A
process that gave up on a failed peer ends the job at exit instead of finalizing (``mpi_exit``).
"""
from __future__ import annotations

import hashlib
import os
import struct
import threading
from typing import Optional

import numpy as np

from ..processes import host_identity, process_stat
from ..errors import CollectiveMismatchError, PeerFailureError
from .base import HEADER_SIZE, Fingerprint, Transport, check_header, pack_header, unpack_header
from .mpi_collectives import MpiCollectives
from .mpi_exit import at_process_exit  # noqa: F401 (transports reach it here)
from .mpi_notices import LEFT, Notices
from .mpi_waiting import RequestWaiting

_TAG = 0x4E46
_CHUNK = 1 << 30  # MPI counts are C ints
_IDENTITY = struct.Struct("<16sQQ")  # host key, pid, process start time


def _import_mpi():
    try:
        from mpi4py import MPI
    except ImportError as e:
        raise ImportError("the 'mpi' backend needs mpi4py and an MPI library: "
                          "pip install mpi4py (with Open MPI or MPICH installed), "
                          f"or choose backend 'tcp' or 'shm' ({e})") from e
    return MPI


def _host_key() -> bytes:
    """Equal for two processes exactly when they can see each other's pids."""
    return hashlib.sha256(host_identity("pid").encode()).digest()[:16]


def _chunks(view: memoryview) -> list[memoryview]:
    return [view[i:i + _CHUNK] for i in range(0, view.nbytes, _CHUNK)]


def _byte_view(buf: np.ndarray, writable: bool, what: str) -> memoryview:
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} buffer must be a numpy array, got {type(buf).__name__}")
    if not buf.flags.c_contiguous or (writable and not buf.flags.writeable):
        raise ValueError(f"{what} buffer must be C-contiguous{' and writable' if writable else ''}"
                         f"; got shape {buf.shape}, strides {buf.strides}")
    return memoryview(buf.reshape(-1).view(np.uint8))


def create(rank: Optional[int] = None, world_size: Optional[int] = None, store=None,
           timeout: float = 1800.0, comm=None) -> "MpiTransport":
    return MpiTransport(rank, world_size, store, timeout, comm)


class MpiTransport(RequestWaiting, Transport):
    name = "mpi"

    def __init__(self, rank: Optional[int] = None, world_size: Optional[int] = None, store=None,
                 timeout: float = 1800.0, comm=None) -> None:
        self._mpi = MPI = _import_mpi()
        base = MPI.COMM_WORLD if comm is None else comm
        mpi_rank, mpi_size = base.Get_rank(), base.Get_size()
        for name, given, actual in (("rank", rank, mpi_rank), ("world_size", world_size, mpi_size)):
            if given is not None and given != actual:
                raise ValueError(f"{name}={given} but the MPI communicator says {actual} "
                                 f"(rank {mpi_rank} of {mpi_size})")
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        super().__init__(mpi_rank, mpi_size, float(timeout))
        self._comm = base.Dup()  # collective, like MPI_Init: no timeout can apply here
        self._lock = threading.Lock()
        self._unusable: dict[int, str] = {}
        self._notices = Notices(MPI, self._comm, mpi_rank, mpi_size)
        self._left: set[int] = set()  # peers that closed their transport (they left the job)
        self._local_peers: dict[int, tuple[int, int]] = {}  # known after the exchange below
        # The next liveness look (``_look``), shared by every wait: a run of short waits is
        # watched as closely as one long wait.
        self._next_check = 0.0
        mine = np.frombuffer(_IDENTITY.pack(_host_key(), os.getpid(),
                                            (process_stat(os.getpid()) or (b"", 0))[1]), np.uint8)
        table = np.empty((mpi_size, _IDENTITY.size), np.uint8)
        self._wait([self._comm.Iallgather(mine, table)], [], Fingerprint("mpi.setup", 0, "", 0))
        rows = [_IDENTITY.unpack(row.tobytes()) for row in table]
        self._local_peers = {r: (pid, start) for r, (key, pid, start) in enumerate(rows)
                             if key == rows[mpi_rank][0] and r != mpi_rank}

    @property
    def comm(self):
        return self._comm

    @property
    def local_peer_pids(self) -> dict:
        """Pids of the peers on this host by rank (the heartbeat watches them for hangs)."""
        return {rank: pid for rank, (pid, _) in self._local_peers.items()}

    # ---- point to point ----------------------------------------------------------------------
    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, False, "send")
        with self._lock:
            self._check_peer(dst, fp)
            self._wait(self._post_send(payload, dst, fp), [dst], fp)

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        payload = _byte_view(buf, True, "recv")
        with self._lock:
            self._check_peer(src, fp)
            self._recv_after([], payload, src, fp)

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        out, into = _byte_view(sendbuf, False, "send"), _byte_view(recvbuf, True, "recv")
        with self._lock:
            self._check_peer(dst, fp)
            self._check_peer(src, fp)
            self._recv_after(self._post_send(out, dst, fp), into, src, fp)

    def _post_send(self, payload: memoryview, dst: int, fp: Fingerprint) -> list:
        MPI = self._mpi
        header = bytearray(pack_header(fp, payload.nbytes))  # kept alive by the request
        reqs = [self._comm.Isend([header, MPI.BYTE], dst, _TAG)]
        reqs += [self._comm.Isend([c, MPI.BYTE], dst, _TAG) for c in _chunks(payload)]
        return reqs

    def _recv_after(self, sends: list, payload: memoryview, src: int, fp: Fingerprint) -> None:
        """Receive the header, check it, then the payload, while ``sends`` progress."""
        MPI = self._mpi
        header = bytearray(HEADER_SIZE)
        header_req = self._comm.Irecv([header, MPI.BYTE], src, _TAG)
        self._wait([header_req], [src], fp)
        self._check_received(header, payload, src, fp)
        reqs = sends + [self._comm.Irecv([c, MPI.BYTE], src, _TAG) for c in _chunks(payload)]
        self._wait(reqs, [src], fp)

    def send_recv_many(self, sends, recvs) -> None:
        """A batch: every send posted at once; each peer's receives go one after another (a
        header, checked, then its payload: a header posted early would match the previous
        message's payload), and all peers' at once, in one poll over the requests."""
        if not sends and not recvs:
            return
        first = (sends or recvs)[0][2]
        with self._lock:
            reqs, queues = [], {}
            for buf, dst, fp in sends:
                payload = _byte_view(buf, False, "send")
                self._check_peer(dst, fp)
                reqs += self._post_send(payload, dst, fp)
            for buf, src, fp in recvs:
                payload = _byte_view(buf, True, "recv")
                self._check_peer(src, fp)
                queues.setdefault(int(src), []).append((payload, fp))
            peers = sorted({int(p) for _, p, _ in sends} | set(queues))
            active: dict = {}  # src -> (header buffer, header request, payload requests)

            def advance() -> list:
                MPI = self._mpi
                pending = [r for r in reqs if not r.Test()]
                reqs[:] = pending
                for src in list(queues):
                    if src in active:
                        header, header_req, payload_reqs = active[src]
                        if payload_reqs is None:
                            if not header_req.Test():
                                pending.append(header_req)
                                continue
                            payload, fp = queues[src][0]
                            self._check_received(header, payload, src, fp)
                            payload_reqs = [self._comm.Irecv([c, MPI.BYTE], src, _TAG)
                                            for c in _chunks(payload)]
                            active[src] = (header, header_req, payload_reqs)
                        payload_reqs = [r for r in payload_reqs if not r.Test()]
                        if payload_reqs:
                            active[src] = (header, header_req, payload_reqs)
                            pending += payload_reqs
                            continue
                        del active[src]
                        queues[src].pop(0)
                        if not queues[src]:
                            del queues[src]
                            continue
                    header = bytearray(HEADER_SIZE)
                    header_req = self._comm.Irecv([header, MPI.BYTE], src, _TAG)
                    active[src] = (header, header_req, None)
                    pending.append(header_req)
                return pending

            self._wait(advance(), peers, first, advance)

    def _check_received(self, header: bytearray, payload: memoryview, src: int,
                        fp: Fingerprint) -> None:
        try:
            got, nbytes = unpack_header(header)
        except ValueError as e:
            self._unusable[src] = f"malformed header in {fp.describe()}"
            raise CollectiveMismatchError(f"peer rank {src} sent a malformed header ({e}) while "
                                          f"we expected {fp.describe()}", rank=self.rank,
                                          peer=src, op=fp.op, seq=fp.seq) from None
        try:
            check_header(fp, got, nbytes, payload.nbytes, rank=self.rank, peer=src)
        except CollectiveMismatchError:
            self._unusable[src] = f"mismatched header in {fp.describe()}"
            raise

    def _check_peer(self, peer: int, fp: Fingerprint) -> None:
        self.check_peer_rank(peer, fp)
        if self._comm is None:
            raise PeerFailureError("transport is closed", rank=self.rank, peer=peer, op=fp.op,
                                   seq=fp.seq)
        if peer in self._unusable:
            raise PeerFailureError(f"connection unusable: {self._unusable[peer]}",
                                   rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)

    # ---- waiting -----------------------------------------------------------------------------
    def wait_requests(self, reqs: list, fp: Fingerprint) -> None:
        """Complete requests posted on ``comm`` by the caller, bounded like every other wait."""
        with self._lock:
            self._wait(reqs, [], fp)

    def native_collectives(self) -> MpiCollectives:
        return MpiCollectives(self)

    def close(self) -> None:
        """Tell the peers this rank leaves, free the duplicated communicator. Safe to call
        twice."""
        polite = self._lock.acquire(timeout=1.0)  # never interleave with a message in flight
        try:
            comm, self._comm = self._comm, None
            if comm is not None and not self._mpi.Is_finalized():
                self._notices.send(LEFT, self.rank)
                self._notices.finish()
        finally:
            if polite:
                self._lock.release()
        if comm is not None and not self._mpi.Is_finalized():
            try:
                comm.Free()
            except self._mpi.Exception:
                pass
