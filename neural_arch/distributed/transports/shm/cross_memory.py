"""Reading a peer rank's memory directly: Linux cross-memory attach (``process_vm_readv``).

A user buffer is private to its process, so the workspace algorithms (``direct``) copy every
byte into shared memory and back out. With cross-memory attach a rank reads a peer's buffer
straight into its own in one copy, as Open MPI's shared-memory transport does. The kernel lets
a process read another only where ptrace would be allowed: the same user (or CAP_SYS_PTRACE),
and under Yama's ``ptrace_scope`` 1 only a process that named its reader; ranks are siblings,
not ancestors, so each rank names "any process of this user" (``PR_SET_PTRACER_ANY``) before
the others probe it, and only where Yama asks for it.

The same permission lets a process write a peer's memory (``process_vm_writev``): an
all-reduce's owner writes each reduced chunk into its peers, and a two-rank broadcast's root
writes half of its bytes into the reader's buffer while the reader reads the other half, so
both cores copy (``single_copy``).

Whether the job uses peer reads, and peer writes, is settled once, at set-up
(``PeerReads.agree``): each rank publishes a random token in its control line and the address
of a private copy of it, reads every peer's copy and compares, then writes its own token into
a slot of that copy kept for it and reads it back; every rank then publishes its verdict and
waits for the others'. One rank that cannot (another operating system, a refused read, a pid
that belongs to another process, ``NEURAL_ARCH_SHM_PEER_READ=0``) turns them off for all, so
every rank always takes the same algorithm (a rank that can read but not write turns off the
writes only). Being unable is a property of the machine, not an error: the workspace
algorithms stand. A read or write that fails in the middle of a collective (the peer died:
ESRCH; its buffer is gone: EFAULT) raises PeerFailureError naming the peer and the operation.
"""
from __future__ import annotations

import ctypes
import errno
import os
import secrets
import sys
from typing import Any, Optional

import numpy as np

from ...errors import PeerFailureError
from . import read_cost
from .layout import BUFFER, PEER_READ, PROBE_ADDRESS, PROBE_TOKEN
from .waiting import Backoff

PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1)
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
MAX_READ_BYTES = 1 << 30  # one process_vm_readv moves at most ~2 GiB: larger reads in pieces
# A rank's verdict word: 0 while undecided, then DECIDED with READS and WRITES where it can,
# and PAYS where a read through the kernel costs little more than a copy (``read_cost``).
DECIDED, READS, WRITES, PAYS = 1, 2, 4, 8
ENV_SWITCH = "NEURAL_ARCH_SHM_PEER_READ"
# What each value of the switch lets this rank do to its peers' memory; PAYS: taken as paying
# without timing it (auto times it)
SWITCH_VALUES = {"auto": READS | WRITES, "1": READS | WRITES | PAYS,
                 "on": READS | WRITES | PAYS, "read": READS, "0": 0, "off": 0}
ENABLED_VALUES = (0, READS, READS | WRITES, READS | PAYS, READS | WRITES | PAYS)


def switched_on() -> int:
    """``NEURAL_ARCH_SHM_PEER_READ``: auto (default): read and write peers' memory where every
    rank can, the built-in choices taking reads only where they were timed to pay
    (``read_cost``); 1 or on: the same, reads taken as paying untimed; read: read only (every
    rank then reads the owners' slices itself), timed as auto; 0 or off: never. Returns READS,
    WRITES and PAYS as allowed. Any other value is a ValueError naming the variable and
    value."""
    value = os.environ.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if value not in SWITCH_VALUES:
        raise ValueError(f"{ENV_SWITCH}={value!r}; use one of {', '.join(SWITCH_VALUES)}")
    return SWITCH_VALUES[value]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc_reader() -> Optional[Any]:
    """libc, with ``process_vm_readv`` and ``process_vm_writev`` typed, or None where it has
    no ``process_vm_readv`` (not Linux, old libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        read = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    calls = [read, getattr(libc, "process_vm_writev", None)]
    for call in filter(None, calls):
        call.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                         ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
        call.restype = ctypes.c_ssize_t
    return libc


def allow_peer_readers(libc: Any) -> bool:
    """Under Yama's ptrace_scope 1, let this user's other processes (the peers) read this one
    (True: undo it with ``forbid_peer_readers`` once peer reads end); elsewhere change
    nothing."""
    try:
        with open(YAMA_SCOPE) as f:
            scope = f.read().strip()
    except OSError:
        return False
    if scope == "1":
        return libc.prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) == 0
    return False


def forbid_peer_readers(libc: Any) -> None:
    """Back to Yama's default for this process: only its ancestors may read it."""
    libc.prctl(PR_SET_PTRACER, 0, 0, 0, 0)


class PeerReads:
    """One rank's reader (and writer) of its peers' memory, and the job's agreement on using it.

    ``enabled``: ``switched_on()`` as the caller read it (READS and WRITES as allowed, PAYS
    where reads are taken as paying untimed; True: reads and writes; False or 0: this rank
    says no at ``agree``). ``usable`` is False until ``agree``
    found that every rank can read every peer; afterwards ``read(peer, address, out, op,
    seq)`` copies ``out.nbytes`` bytes at ``address``
    in ``peer``'s memory into ``out`` (a C-contiguous array) or raises PeerFailureError.
    ``writable``: every rank can also write every peer, with ``write(peer, address, data, op,
    seq)``. ``pays``: every rank found a read through the kernel cheap (``reads_pay``), or
    was told to take it as cheap; the built-in choices (``tuning``) take peer reads only then.
    """

    def __init__(self, rank: int, world_size: int, enabled: int = READS | WRITES) -> None:
        self.rank, self.world_size = rank, world_size
        self.usable = self.writable = self.pays = False
        if isinstance(enabled, (bool, np.bool_)):
            enabled = (READS | WRITES) if enabled else 0
        if not isinstance(enabled, (int, np.integer)) or enabled not in ENABLED_VALUES:
            raise ValueError(f"enabled must be a bool, 0, READS ({READS}) or READS | WRITES "
                             f"({READS | WRITES}), those two with PAYS ({PAYS}) or not, got "
                             f"{enabled!r}")
        self._allowed = int(enabled)
        self.pids = [0] * world_size
        self._libc = _libc_reader() if enabled & READS else None
        self._call = self._libc.process_vm_readv if self._libc is not None else None
        self._write_call = getattr(self._libc, "process_vm_writev", None)
        self._local, self._remote = _IoVec(), _IoVec()
        self._local_ref, self._remote_ref = ctypes.byref(self._local), ctypes.byref(self._remote)
        token = secrets.randbits(62) + 1
        # The private copy peers read at set-up (word 0), then a slot per rank for its write.
        self.probe = np.zeros(1 + world_size, np.int64)
        self.probe[0] = token
        self._scratch = np.empty(0, np.uint8)
        self.buffer_words: tuple = ()
        self.plans: dict = {}  # the chunks of each all-reduce shape (``single_copy``)
        self.kept: list = []  # buffers a failed call left open to its peers' writes
        self._opened = self._libc is not None and allow_peer_readers(self._libc)

    def scratch(self, dtype: np.dtype, n: int) -> np.ndarray:
        """Private scratch of ``n`` elements of ``dtype`` (kept between calls, grown when
        needed; 64-byte aligned, like the slices it holds)."""
        nbytes = n * np.dtype(dtype).itemsize
        if self._scratch.size < nbytes + 64:
            self._scratch = np.empty(nbytes + 64, np.uint8)
            self.plans.clear()  # their rows are views of the scratch it replaces
        start = -self._scratch.ctypes.data % 64
        return self._scratch[start:start + nbytes].view(dtype)

    def publish(self, ctrl: Any, token_word: int, address_word: int) -> None:
        """Store this rank's probe token and its private copy's address (0: cannot read)."""
        ctrl[token_word] = int(self.probe[0])
        ctrl[address_word] = self.probe.ctypes.data if self._call is not None else 0

    def agree(self, t: Any, pids: list) -> None:
        """After every rank published (``publish``, before its pid): probe each peer, publish
        this rank's verdict and wait for everyone's; ``usable`` when all can read, ``writable``
        when all can also write."""
        ctrl, layout, p = t.ctrl, t.layout, self.world_size
        self.pids = list(pids)
        verdict = self._allowed & (READS | WRITES)
        for q in range(p):
            if q != self.rank:
                verdict &= self.probe_peer(pids[q], ctrl[layout.rank_word(q, PROBE_TOKEN)],
                                           ctrl[layout.rank_word(q, PROBE_ADDRESS)])
        if not verdict & READS:
            verdict = 0  # writes alone are never used
        elif self._allowed & PAYS or self.reads_pay():
            verdict |= PAYS
        ctrl[layout.rank_word(self.rank, PEER_READ)] = DECIDED | verdict
        words = [layout.rank_word(q, PEER_READ) for q in range(p)]
        backoff = Backoff(t.watch, t.timeout, "shm_rendezvous", None,
                          "every rank's verdict on reading its peers' memory")
        while True:
            missing = [q for q in range(p) if ctrl[words[q]] == 0]
            if not missing:
                break
            backoff.pause(missing)
        agreed = READS | WRITES | PAYS
        for w in words:
            agreed &= int(ctrl[w])
        self.usable = bool(agreed & READS)
        self.writable = bool(agreed & WRITES)
        self.pays = bool(agreed & PAYS)
        self.buffer_words = tuple(layout.rank_word(q, BUFFER) for q in range(p))
        if not self.usable:
            self.close()

    def keep(self, buf: np.ndarray) -> None:
        """Keep ``buf`` alive as long as this object: a call that failed while its peers may
        still write into it must not let its memory be freed and reused under them."""
        self.kept.append(buf)

    def close(self) -> None:
        """Peer reads are over (the transport closed, or the job cannot use them): undo what
        ``allow_peer_readers`` opened."""
        self.usable = self.writable = self.pays = False
        if self._opened:
            self._opened = False
            forbid_peer_readers(self._libc)

    def probe_peer(self, pid: int, token: int, address: int) -> int:
        """What this rank can do to the peer: READS where reading the peer's private copy of
        its token gives the token, with WRITES where this rank's own token written into its
        slot of that copy reads back."""
        if self._call is None or address == 0 or pid <= 0:
            return 0
        got = np.zeros(1, np.int64)
        if self._raw(self._call, pid, address, got.ctypes.data, 8) != 8 or int(got[0]) != token:
            return 0
        if self._write_call is None or not self._allowed & WRITES:
            return READS  # no write, not even a probe's, where this rank may not write
        slot = address + 8 * (1 + self.rank)
        mine, got[0] = self.probe[:1], 0
        wrote = self._raw(self._write_call, pid, slot, mine.ctypes.data, 8) == 8
        if not wrote or self._raw(self._call, pid, slot, got.ctypes.data, 8) != 8:
            return READS
        return READS | (WRITES if int(got[0]) == int(mine[0]) else 0)

    def reads_pay(self) -> bool:
        """Whether a read through the kernel costs little enough here for peer reads to pay
        (``read_cost.pays``): a few milliseconds at most, once per job."""
        return self._call is not None and read_cost.pays(self._read_raw)

    def read_cost_ratio(self) -> Optional[float]:
        """A read through the kernel over a copy of the same bytes (``read_cost.ratio``);
        None where this machine has no such read or it fails."""
        return None if self._call is None else read_cost.ratio(self._read_raw)

    def _read_raw(self, pid: int, remote: int, local: int, nbytes: int) -> int:
        return self._raw(self._call, pid, remote, local, nbytes)

    def _raw(self, call: Any, pid: int, remote: int, local: int, nbytes: int) -> int:
        self._local.base, self._local.len = local, nbytes
        self._remote.base, self._remote.len = remote, nbytes
        return call(pid, self._local_ref, 1, self._remote_ref, 1, 0)

    def read(self, peer: int, address: int, out: np.ndarray, op: str,
             seq: Optional[int]) -> None:
        """Copy ``out.nbytes`` bytes from ``address`` in rank ``peer``'s memory into ``out``."""
        self._move(self._call, "reading", peer, address, out, op, seq)

    def write(self, peer: int, address: int, data: np.ndarray, op: str,
              seq: Optional[int]) -> None:
        """Copy ``data`` (C-contiguous) to ``address`` in rank ``peer``'s memory (``writable``
        said every rank can)."""
        self._move(self._write_call, "writing", peer, address, data, op, seq)

    def _move(self, call: Any, verb: str, peer: int, address: int, local: np.ndarray, op: str,
              seq: Optional[int]) -> None:
        nbytes, done, base = local.nbytes, 0, local.ctypes.data
        moved = 0
        while done < nbytes:
            # one call moves at most ~2 GiB (the kernel's MAX_RW_COUNT): move in pieces
            want = min(nbytes - done, MAX_READ_BYTES)
            moved = self._raw(call, self.pids[peer], address + done, base + done, want)
            if moved <= 0:
                break
            done += moved
        if done != nbytes:
            code = ctypes.get_errno() if moved < 0 else 0
            why = (f"{errno.errorcode.get(code, code)}: {os.strerror(code)}" if moved < 0
                   else f"only {done} bytes moved")
            gone = " (the peer process is gone)" if code == errno.ESRCH else ""
            raise PeerFailureError(
                f"{verb} {nbytes} bytes of peer rank {peer}'s buffer (pid {self.pids[peer]}, "
                f"address {address:#x}) failed{gone}: {why}", rank=self.rank, peer=peer,
                op=op, seq=seq)
