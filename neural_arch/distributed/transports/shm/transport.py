"""Shared-memory transport: one segment per job holding counters, p2p rings and a workspace.

Rank 0 creates a POSIX shared-memory segment (name ``nf_<pid>_<random>``), publishes its name
through the store, and every rank maps it. As soon as all ranks have mapped it, the name is
unlinked: the mappings stay valid, and nothing can be left in /dev/shm even if ranks are killed
with SIGKILL afterwards. Until then the creator also unlinks on close, at exit and on SIGTERM
(``segment``).

Point-to-point messages move through one ring per ordered pair of ranks (``rings``). The
workspace (two halves, alternated by generation) and the per-rank control lines serve the
transport's own collectives (``collectives``, on the barrier of ``generation``). At set-up the
ranks also agree whether they may read each other's memory directly (``cross_memory``), which
the large all-reduce and broadcast use where that is faster (``single_copy``).

Memory ordering: a writer copies its data, then stores the counter; a reader loads the counter,
then the data. On x86-64 aligned 8-byte stores and loads are atomic and neither stores nor loads
are reordered with each other, which is all this protocol needs; other CPUs would need fences.
Large copies into the workspace may use streaming stores (``writer``), which x86 does
reorder with later stores; the streaming copy therefore ends with a full fence.
"""
from __future__ import annotations

import json
import os
import secrets
from typing import Optional

import numpy as np

from ...errors import CollectiveMismatchError, DistributedError, RendezvousError
from .. import entry_table
from ..base import Fingerprint, Transport, check_job
from .collectives import ShmCollectives
from .cross_memory import READS, WRITES, PeerReads, switched_on
from .generation import Generation
from .layout import CLOSED, PID, PROBE_ADDRESS, PROBE_TOKEN, ShmLayout
from .rings import RingMessages
from .segment import attach_segment, create_segment, unlink_segment
from .waiting import Backoff, PeerWatch

DEFAULT_SLOTS = 4
DEFAULT_SLOT_BYTES = 512 << 10
DEFAULT_WORKSPACE_BYTES = 2 << 20


class ShmTransport(RingMessages, Transport):
    """Point-to-point messages and a shared workspace between the ranks of one machine."""

    name = "shm"

    def __init__(self, rank: int, world_size: int, timeout: float, mm, layout: ShmLayout,
                 segment_name: str, peer_reads: int = READS | WRITES) -> None:
        super().__init__(rank, world_size, timeout)
        self.layout = layout
        self.segment_name = segment_name
        self._mm = mm
        self.ctrl = memoryview(mm).cast("q")
        self.shared = np.frombuffer(mm, np.uint8)
        self._sent = [0] * world_size
        self._received = [0] * world_size
        self.base_address = self.shared.ctypes.data
        self.closed = False
        self.watch = PeerWatch(rank, [0] * world_size, self._peer_closed)
        self.generation = Generation(self.ctrl, self.base_address, rank, world_size, self)
        self.peer_reads = PeerReads(rank, world_size, peer_reads)
        self.collectives = ShmCollectives(self)

    # ----- rendezvous -----------------------------------------------------------------
    def _join(self) -> None:
        """Announce this rank, wait for every rank to map the segment, then unlink its name;
        then agree on peer reads (the probe is published before the pid that announces it)."""
        layout, ctrl = self.layout, self.ctrl
        self.peer_reads.publish(ctrl, layout.rank_word(self.rank, PROBE_TOKEN),
                                layout.rank_word(self.rank, PROBE_ADDRESS))
        ctrl[layout.rank_word(self.rank, PID)] = os.getpid()
        backoff = Backoff(self.watch, self.timeout, "shm_rendezvous", None,
                          f"every rank to map segment {self.segment_name}")
        while True:
            missing = [r for r in range(self.world_size) if ctrl[layout.rank_word(r, PID)] == 0]
            if not missing:
                break
            backoff.pause(missing)
        unlink_segment(self.segment_name)
        pids = [ctrl[layout.rank_word(r, PID)] for r in range(self.world_size)]
        self.watch.know(pids)
        self.peer_reads.agree(self, pids)
        self.collectives.peer_reads_agreed()

    def _peer_closed(self, peer: int) -> bool:
        return self.ctrl[self.layout.rank_word(peer, CLOSED)] != 0

    def native_collectives(self) -> Optional[ShmCollectives]:
        """The direct collectives through the workspace (None once closed)."""
        return None if self.closed else self.collectives

    # ----- teardown -------------------------------------------------------------------
    def close(self) -> None:
        if self.closed:
            return
        mismatch = self._settle_last_broadcast()
        self.closed = True
        try:
            self.ctrl[self.layout.rank_word(self.rank, CLOSED)] = 1
        except (ValueError, IndexError):
            pass
        unlink_segment(self.segment_name)
        self.collectives.close()
        self.peer_reads.close()
        self.ctrl.release()
        self.shared = None
        try:
            self._mm.close()
        except BufferError:
            pass  # a view handed out elsewhere still exists; the mapping goes with it
        if mismatch is not None:
            raise mismatch

    def _settle_last_broadcast(self) -> Optional[CollectiveMismatchError]:
        """A broadcast's root that returned without waiting (``generation``) and closes now
        waits for its readers to reach that broadcast, its last chance to learn that they
        called another collective there (two ranks that each took themselves for the root,
        say): the mismatch is raised once the transport is closed. A reader that died or
        closed first has nothing left to read."""
        if not self.generation.left_early():
            return None
        try:
            self.collectives.settle_early(Fingerprint("close", 0, "uint8", 0))
        except CollectiveMismatchError as exc:
            return exc
        except DistributedError:  # a dead or closed peer, a timeout: no reader to tell
            pass
        return None


def create(rank: int, world_size: int, store, timeout: float, prefix: str = "shm", *,
           slots: int = DEFAULT_SLOTS, slot_bytes: int = DEFAULT_SLOT_BYTES,
           workspace_bytes: int = DEFAULT_WORKSPACE_BYTES) -> ShmTransport:
    """Create (rank 0) or attach to (others) this job's segment and return the transport.

    ``store`` is any object with ``set(key, bytes)`` and a blocking ``get(key) -> bytes``.
    """
    check_job(rank, world_size, timeout)
    peer_reads = switched_on()  # a misspelt switch fails here, before any segment exists
    entry_table.enabled()  # so does NEURAL_ARCH_SHORT_C (read again by the short calls)
    key = f"{prefix}/nf_segment"
    if rank == 0:
        layout = ShmLayout(world_size, slots, slot_bytes, workspace_bytes)
        name = f"nf_{os.getpid()}_{secrets.token_hex(6)}"
        mm = create_segment(name, layout.total_bytes)
        try:
            store.set(key, json.dumps({"name": name, **layout.params()}).encode())
        except BaseException:
            unlink_segment(name)
            mm.close()
            raise
    else:
        raw = store.get(key)
        try:
            info = json.loads(bytes(raw).decode())
            name = info.pop("name")
            layout = ShmLayout(**info)
        except (ValueError, KeyError, TypeError) as e:
            raise RendezvousError(f"store key {key!r} does not describe a shared-memory segment: "
                                  f"{raw[:200]!r} ({e})", rank=rank) from None
        if layout.world_size != world_size:
            raise RendezvousError(f"segment {name} was made for {layout.world_size} ranks but this "
                                  f"rank expects world_size {world_size}", rank=rank)
        mm = attach_segment(name, layout.total_bytes, rank)
    try:
        transport = ShmTransport(rank, world_size, timeout, mm, layout, name, peer_reads)
    except BaseException:  # before _join: no rank has unlinked the segment's name yet
        unlink_segment(name)
        try:
            mm.close()
        except BufferError:  # views of the half-made transport still held: freed with them
            pass
        raise
    try:
        transport._join()
    except BaseException:
        transport.close()
        raise
    return transport
