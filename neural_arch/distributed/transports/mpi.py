"""MPI transport over mpi4py, with MPI's own collectives exposed beside ours for comparison.

Traffic runs on a duplicate of the communicator so it never matches the application's own
receives. Each message carries a small header (the fingerprint), in the same MPI message as a
small payload or just before a large one (``mpi_wire``). Every wait is a poll over non-blocking
requests bounded by ``timeout`` (``mpi_waiting``).

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
from typing import Callable, NoReturn, Optional, Sequence

import numpy as np

from ..processes import host_identity, process_stat
from ..errors import PeerFailureError
from .base import Fingerprint, Transport, pack_header
from .mpi_batch import run_batch
from .mpi_chained import run_chained
from .mpi_collectives import MpiCollectives
from .mpi_exit import at_process_exit  # noqa: F401 (transports reach it here)
from .mpi_exchanges import PairExchanges, byte_view, compilable
from .mpi_notices import Notices
from .mpi_waiting import RequestWaiting
from .mpi_wire import CHUNK, DONE, FirstBuffers, Incoming, first_max_bytes, post_send
from . import mpi_compiled

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


def create(rank: Optional[int] = None, world_size: Optional[int] = None, store=None,
           timeout: float = 1800.0, comm=None) -> "MpiTransport":
    return MpiTransport(rank, world_size, store, timeout, comm)


class MpiTransport(PairExchanges, RequestWaiting, Transport):
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
        self.abandoned: list = []  # requests a failed call left in flight, with their buffers
        self._notices = Notices(MPI, self._comm, mpi_rank, mpi_size, kept=self.abandoned)
        self._left: set[int] = set()  # peers that closed their transport (they left the job)
        self._native: Optional[MpiCollectives] = None
        first_bytes = first_max_bytes(mpi_size)
        self.first_buffers = FirstBuffers(first_bytes)  # the wire's first messages, per peer
        self.send_buffers = FirstBuffers(first_bytes)  # what ``swap`` packs into, per peer
        self.status = MPI.Status()  # read at once after each Test that fills it (lock held)
        # swaps and sendrecvs in one compiled call each, once hot
        self._compiled = mpi_compiled.CompiledExchanges(self)
        self._local_peers: dict[int, tuple[int, int]] = {}  # known after the exchange below
        # The next liveness look (``_look``), shared by every wait: a run of short waits is
        # watched as closely as one long wait.
        self._next_check = 0.0
        mine = np.frombuffer(_IDENTITY.pack(_host_key(), os.getpid(),
                                            (process_stat(os.getpid()) or (b"", 0))[1]), np.uint8)
        table = np.empty((mpi_size, _IDENTITY.size), np.uint8)
        setup = Fingerprint("mpi.setup", 0, "uint8", _IDENTITY.size)
        try:
            exchange = self._comm.Iallgather(mine, table)
        except MPI.Exception as e:  # a rank failed already (fault tolerance on): name it
            self._mpi_error([], [], setup, e)
        self._wait([exchange], [], setup)
        rows = [_IDENTITY.unpack(row.tobytes()) for row in table]
        self._local_peers = {r: (pid, start) for r, (key, pid, start) in enumerate(rows)
                             if key == rows[mpi_rank][0] and r != mpi_rank}

    @property
    def comm(self):
        return self._comm

    @property
    def mpi(self):
        """The ``mpi4py.MPI`` module this transport runs on."""
        return self._mpi

    @property
    def lock(self) -> threading.Lock:
        """Held by every call that posts or waits on ``comm`` (one message stream at a time)."""
        return self._lock

    def mark_unusable(self, peer: int, why: str) -> None:
        """Refuse every later message with ``peer``: its stream is out of step (``why``)."""
        self._unusable[peer] = why

    @property
    def local_peer_pids(self) -> dict:
        """Pids of the peers on this host by rank (the heartbeat watches them for hangs)."""
        return {rank: pid for rank, (pid, _) in self._local_peers.items()}

    # ---- point to point ----------------------------------------------------------------------
    def send(self, buf: np.ndarray, dst: int, fp: Fingerprint) -> None:
        payload = byte_view(buf, False, "send")
        with self._lock:
            self.check_peer(dst, fp)
            posted: list = []
            try:
                try:
                    post_send(self._comm, self._mpi, payload, dst, fp, into=posted)
                except self._mpi.Exception as e:  # ``_wait`` converts those of its own polls
                    self._mpi_error(posted, [dst], fp, e)
                self._wait(posted, [dst], fp)
            except BaseException:
                self.abandoned.append(posted)  # a send given up may still read its buffers
                raise

    def recv(self, buf: np.ndarray, src: int, fp: Fingerprint) -> None:
        payload = byte_view(buf, True, "recv")
        with self._lock:
            self.check_peer(src, fp)
            self._receive_while([], Incoming(self, payload, src, fp))

    def sendrecv(self, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray, src: int,
                 fp: Fingerprint) -> None:
        out, into = byte_view(sendbuf, False, "send"), byte_view(recvbuf, True, "recv")
        with self._lock:
            self.check_peer(dst, fp)
            if src != dst:
                self.check_peer(src, fp)
            if (compilable(sendbuf) and not recvbuf.dtype.hasobject
                    and self._compiled.takes(self, max(out.nbytes, into.nbytes), CHUNK)):
                self._compiled.sendrecv(self, sendbuf, dst, recvbuf, src, fp)
                return
            header = pack_header(fp, out.nbytes)  # a symmetric exchange expects the same
            incoming = Incoming(self, into, src, fp, header if into.nbytes == out.nbytes
                                else None)
            sends: list = []
            try:
                incoming.post()  # before the send (judged after): the peer's message finds it
                post_send(self._comm, self._mpi, out, dst, fp, header, into=sends)
            except self._mpi.Exception as e:
                self.abandoned += [incoming, sends]  # its receive may still land
                self._mpi_error(incoming.reqs + sends, [src, dst], fp, e)
            self._receive_while(sends, incoming)

    def _receive_while(self, sends: list, incoming: Incoming) -> None:
        """Receive ``incoming`` while ``sends`` progress, in one poll over both. On failure
        every request is cancelled (as ``_wait`` does) and both kept: a receive given up may
        still land in its buffers, a send still read its own."""
        MPI = self._mpi
        testall = MPI.Request.Testall

        def advance():
            # one send (a packed message, the usual case): its own Test, a quarter of Testall's
            if incoming.step() == DONE and (sends[0].Test() if len(sends) == 1
                                            else testall(sends)):
                return None
            return sends + incoming.reqs
        try:
            try:
                if advance() is None and not self.look_due():
                    return  # done at the first poll, as a small exchange often is
            except MPI.Exception as e:  # ``_wait`` converts those of its own polls
                self._mpi_error(sends + incoming.reqs, [incoming.src], incoming.fp, e)
            self._wait(sends + incoming.reqs, [incoming.src], incoming.fp, advance)
        except BaseException:
            self.abandoned += [incoming, sends]
            raise

    def send_recv_many(self, sends, recvs) -> None:
        """A batch: every send posted at once, and every receive moved on in one poll over the
        batch (``mpi_batch``)."""
        with self._lock:
            run_batch(self, sends, recvs, byte_view)

    def send_recv_chained(self, sends, recvs) -> None:
        """``send_recv_many`` whose receives may each carry a follow-up: ``recvs`` are
        ``(buf, src, fp, then)``; ``then`` (or None) runs as soon as that receive is complete
        and returns messages to send at once. Every message of a call belongs to the same
        collective, whose fingerprint fixes every size on both sides (``mpi_chained``)."""
        with self._lock:
            run_chained(self, sends, recvs, byte_view)

    def check_peer(self, peer: int, fp: Fingerprint) -> None:
        """Raise before a message with ``peer``: not a peer, transport closed, or the peer's
        stream unusable after an earlier failure."""
        if type(peer) is not int or not 0 <= peer < self.world_size or peer == self.rank:
            self.check_peer_rank(peer, fp)  # raises, or takes a NumPy integer rank
        if self._comm is None:
            raise PeerFailureError("transport is closed", rank=self.rank, peer=peer, op=fp.op,
                                   seq=fp.seq)
        if peer in self._unusable:
            raise PeerFailureError(f"connection unusable: {self._unusable[peer]}",
                                   rank=self.rank, peer=peer, op=fp.op, seq=fp.seq)

    # ---- waiting -----------------------------------------------------------------------------
    def wait_requests(self, reqs: list, fp: Fingerprint, peers: Sequence[int] = (),
                      advance=None) -> None:
        """Complete requests the caller posted on ``comm``, bounded by the timeout and watching
        for dead peers like every wait of this transport (``mpi_waiting``); ``peers``: the
        ranks they need (none: any), ``advance``: as ``_wait`` takes it. The caller holds
        ``lock``, under which it posted them."""
        if not self._lock.locked():  # a wait reads the notices: two at once would split them
            raise RuntimeError(f"wait_requests for {fp.describe()} called without holding the "
                               f"transport's lock")
        self._wait(reqs, list(peers), fp, advance)

    def run_collective(self, post: Callable, fp: Fingerprint) -> None:
        """Post one non-blocking MPI collective with ``post(comm)`` under ``lock`` and wait for
        it like every wait of this transport. An MPI error at the post becomes the transport's
        PeerFailureError (``raise_mpi_error``); a request given up stays in ``abandoned``, since
        it may still touch its buffers."""
        with self._lock:
            try:
                request = post(self._comm)
            except self._mpi.Exception as e:  # a failed peer may fail the post
                self._mpi_error([], [], fp, e)
            try:
                self._wait([request], [], fp, None)
            except BaseException:
                self.abandoned.append(request)
                raise

    def raise_mpi_error(self, reqs: list, fp: Fingerprint, peers: Sequence[int],
                        error: Exception) -> NoReturn:
        """Raise for an MPI error of a call outside a wait (a post, a first test), as a wait
        does: PeerFailureError naming the failed rank when MPI knows one, ``reqs`` cancelled,
        ``peers`` unusable, the job marked broken. The caller holds ``lock``."""
        self._mpi_error(reqs, list(peers), fp, error)

    def native_collectives(self) -> MpiCollectives:
        if self._native is None:  # one, made once: every collective call asks for it
            self._native = MpiCollectives(self)
        return self._native

    def close(self) -> None:
        """Tell the peers this rank leaves; free the duplicated communicator once every peer has
        left too, else keep it (``mpi_notices``: a later communicator would inherit what still
        arrives). Safe to call twice."""
        polite = self._lock.acquire(timeout=1.0)  # never interleave with a message in flight
        free = False
        try:
            comm, self._comm = self._comm, None
            if comm is not None and not self._mpi.Is_finalized():
                # Impolite: a wait of another thread may be reading the notices.
                free = self._notices.leave(self.take_in_notices if polite else None,
                                           self.local_peer_died)
        finally:
            if polite:
                self._lock.release()
        if free and not self._mpi.Is_finalized():
            try:
                comm.Free()
            except self._mpi.Exception:
                pass
