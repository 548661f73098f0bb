"""Reading a peer rank's memory directly: Linux cross-memory attach (``process_vm_readv``).

A user buffer is private to its process, so the workspace algorithms (``direct``) copy every
byte into shared memory and back out. With cross-memory attach a rank reads a peer's buffer
straight into its own in one copy, as Open MPI's shared-memory transport does. The kernel lets
a process read another only where ptrace would be allowed: the same user (or CAP_SYS_PTRACE),
and under Yama's ``ptrace_scope`` 1 only a process that named its reader; ranks are siblings,
not ancestors, so each rank names "any process of this user" (``PR_SET_PTRACER_ANY``) before
the others probe it, and only where Yama asks for it.

Whether the job uses peer reads is settled once, at set-up (``PeerReads.agree``): each rank
publishes a random token in its control line and the address of a private copy of it, reads
every peer's copy and compares; every rank then publishes its verdict and waits for the
others'. One rank that cannot (another operating system, a refused read, a pid that belongs
to another process, ``NEURAL_ARCH_SHM_PEER_READ=0``) turns them off for all, so every rank
always takes the same algorithm. Being unable is a property of the machine, not an error: the
workspace algorithms stand. A read that fails in the middle of a collective (the peer died:
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
from .layout import BUFFER, PEER_READ, PROBE_ADDRESS, PROBE_TOKEN
from .waiting import Backoff

ENV_SWITCH = "NEURAL_ARCH_SHM_PEER_READ"
SWITCH_VALUES = {"auto": True, "1": True, "on": True, "0": False, "off": False}
PR_SET_PTRACER = 0x59616D61
PR_SET_PTRACER_ANY = ctypes.c_ulong(-1)
YAMA_SCOPE = "/proc/sys/kernel/yama/ptrace_scope"
MAX_READ_BYTES = 1 << 30  # one process_vm_readv moves at most ~2 GiB: larger reads in pieces
YES, NO = 1, 2  # verdict words (0: not decided yet)


def switched_on() -> bool:
    """``NEURAL_ARCH_SHM_PEER_READ``: auto (default), 1 or on: use peer reads where every rank
    can; 0 or off: never. Any other value is a ValueError naming the variable and value."""
    value = os.environ.get(ENV_SWITCH, "auto").strip().lower() or "auto"
    if value not in SWITCH_VALUES:
        raise ValueError(f"{ENV_SWITCH}={value!r}; use one of {', '.join(SWITCH_VALUES)}")
    return SWITCH_VALUES[value]


class _IoVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


def _libc_reader() -> Optional[Any]:
    """libc's ``process_vm_readv``, or None where there is none (not Linux, old libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        read = libc.process_vm_readv
    except (OSError, AttributeError):
        return None
    read.argtypes = [ctypes.c_int, ctypes.POINTER(_IoVec), ctypes.c_ulong,
                     ctypes.POINTER(_IoVec), ctypes.c_ulong, ctypes.c_ulong]
    read.restype = ctypes.c_ssize_t
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
    """One rank's reader of its peers' memory, and the job's agreement on using it.

    ``enabled``: ``switched_on()`` as the caller read it (False: this rank says no at
    ``agree``). ``usable`` is False until ``agree`` found that every rank can read every peer;
    afterwards ``read(peer, address, out, op, seq)`` copies ``out.nbytes`` bytes at ``address``
    in ``peer``'s memory into ``out`` (a C-contiguous array) or raises PeerFailureError.
    """

    def __init__(self, rank: int, world_size: int, enabled: bool = True) -> None:
        self.rank, self.world_size = rank, world_size
        self.usable = False
        self.pids = [0] * world_size
        self._libc = _libc_reader() if enabled else None
        self._call = self._libc.process_vm_readv if self._libc is not None else None
        self._local, self._remote = _IoVec(), _IoVec()
        self._local_ref, self._remote_ref = ctypes.byref(self._local), ctypes.byref(self._remote)
        token = secrets.randbits(62) + 1
        self.probe = np.array([token], np.int64)  # the private copy peers read at set-up
        self._scratch = np.empty(0, np.uint8)
        self.buffer_words: tuple = ()
        self.plans: dict = {}  # the chunks of each all-reduce shape (``single_copy``)
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
        this rank's verdict and wait for everyone's; ``usable`` when all said yes."""
        ctrl, layout, p = t.ctrl, t.layout, self.world_size
        self.pids = list(pids)
        can = all(self.probe_peer(pids[q], ctrl[layout.rank_word(q, PROBE_TOKEN)],
                                  ctrl[layout.rank_word(q, PROBE_ADDRESS)])
                  for q in range(p) if q != self.rank)
        ctrl[layout.rank_word(self.rank, PEER_READ)] = YES if can else NO
        words = [layout.rank_word(q, PEER_READ) for q in range(p)]
        backoff = Backoff(t.watch, t.timeout, "shm_rendezvous", None,
                          "every rank's verdict on reading its peers' memory")
        while True:
            missing = [q for q in range(p) if ctrl[words[q]] == 0]
            if not missing:
                break
            backoff.pause(missing)
        self.usable = all(ctrl[w] == YES for w in words)
        self.buffer_words = tuple(layout.rank_word(q, BUFFER) for q in range(p))
        if not self.usable:
            self.close()

    def close(self) -> None:
        """Peer reads are over (the transport closed, or the job cannot use them): undo what
        ``allow_peer_readers`` opened."""
        self.usable = False
        if self._opened:
            self._opened = False
            forbid_peer_readers(self._libc)

    def probe_peer(self, pid: int, token: int, address: int) -> bool:
        """Whether reading the peer's private copy of its token gives the token."""
        if self._call is None or address == 0 or pid <= 0:
            return False
        got = np.zeros(1, np.int64)
        return self._raw_read(pid, address, got.ctypes.data, 8) == 8 and int(got[0]) == token

    def _raw_read(self, pid: int, address: int, into: int, nbytes: int) -> int:
        self._local.base, self._local.len = into, nbytes
        self._remote.base, self._remote.len = address, nbytes
        return self._call(pid, self._local_ref, 1, self._remote_ref, 1, 0)

    def read(self, peer: int, address: int, out: np.ndarray, op: str,
             seq: Optional[int]) -> None:
        """Copy ``out.nbytes`` bytes from ``address`` in rank ``peer``'s memory into ``out``."""
        nbytes, done, into = out.nbytes, 0, out.ctypes.data
        got = 0
        while done < nbytes:
            # one call moves at most ~2 GiB (the kernel's MAX_RW_COUNT): read in pieces
            want = min(nbytes - done, MAX_READ_BYTES)
            got = self._raw_read(self.pids[peer], address + done, into + done, want)
            if got <= 0:
                break
            done += got
        if done != nbytes:
            code = ctypes.get_errno() if got < 0 else 0
            why = (f"{errno.errorcode.get(code, code)}: {os.strerror(code)}" if got < 0
                   else f"only {done} bytes came")
            gone = " (the peer process is gone)" if code == errno.ESRCH else ""
            raise PeerFailureError(
                f"reading {nbytes} bytes of peer rank {peer}'s buffer (pid {self.pids[peer]}, "
                f"address {address:#x}) failed{gone}: {why}", rank=self.rank, peer=peer,
                op=op, seq=seq)
