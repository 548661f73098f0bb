"""The mpi transport's swaps in one compiled call (``mpi_kernels``), from the first byte
posted to the message judged, a sum folded in.

Through mpi4py a swap pays about ten microseconds of Python around MPI's own two or three
(``benchmarks/mpi_layers.py``: the header packed into a bytearray, each request a Python
object, every ``Test`` and ``Get_count`` a call, the buffers lent and given back), and the fold
that follows, one NumPy call per part, a few more. The kernel takes the same steps on the same
messages in one call that releases the GIL; a sum of float32 or float64 (a ``mpi_swap.Fold``
of ``np.add``: the two-rank all-reduce up to 512 KiB, a round of recursive doubling, AVERAGE
included) is folded in it too, any other ``use`` runs after it in Python. Each rank keeps, per
peer, its own send and first-message buffers as NumPy arrays, the first one sized for any
first message of the wire, as ``FirstBuffers``' are.

What is rare goes back to Python: requests not complete within ``SPIN_NS`` are handed to
the transport's wait (wrapped with ``Request.fromhandle``), with its timeout and liveness
checks, and the fold runs in Python after it; a message that is not the one expected is named
by ``mpi_wire.check_first``; an MPI error becomes the transport's error. A call given up leaves
its buffers in ``abandoned``, never reused: a receive cancelled may still land.

Compiled where Numba is installed and MPI's handles are pointers (Open MPI); elsewhere the swap
stays in mpi4py. Both forms send the same messages, so ranks on either pair up.
``NEURAL_ARCH_MPI_SWAP`` = ``python`` never compiles, ``compiled`` loads the kernels at the
first swap, ``auto`` (the default) after ``HOT_CALLS`` swaps, so that a job making few never
imports Numba for them (importing it and loading the cached kernels take about 0.7 s).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import numpy as np

from .base import HEADER_SIZE, Fingerprint, pack_header
from .mpi_swap import Fold
from .mpi_waiting import YIELD_AFTER_S
from .mpi_wire import TAG, check_first, first_max_bytes, swap_max_bytes
from .shm import compiled

if TYPE_CHECKING:
    from .mpi import MpiTransport

ENV_CHOICE = "NEURAL_ARCH_MPI_SWAP"
HOT_CALLS = compiled.HOT_CALLS
# How long the kernel polls before the wait takes over: the wait's own first stretch before it
# starts yielding the core (``mpi_waiting.YIELD_AFTER_S``), in which a swap of up to 512 KiB
# with a peer that is not late completes
SPIN_NS = int(YIELD_AFTER_S * 1e9)
# The vectors whose sums the kernel folds itself (a 1-D array of another dtype, or another
# reduction, is folded by ``use`` in Python after the kernel's swap)
SUM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

_built: Dict[str, Any] = {}  # "module": ``mpi_kernels`` or None, "why"


def choice() -> str:
    """``auto``, ``python`` or ``compiled``: ``NEURAL_ARCH_MPI_SWAP``."""
    return compiled.choice(ENV_CHOICE)


def why_not_compiled() -> str:
    """Why the small swaps stay in mpi4py ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def kernels(MPI: Any) -> Optional[Any]:
    """``mpi_kernels``, loaded and checked once, or None (``why_not_compiled()`` says why)."""
    if "module" not in _built:
        try:
            sizes = {kind: MPI._sizeof(getattr(MPI, kind))
                     for kind in ("Comm", "Datatype", "Request", "Status")}
        except AttributeError as exc:  # a stand-in for mpi4py
            sizes = {"unknown": repr(exc)}
        if not compiled.allowed():
            _built.update(module=None, why="Numba is not installed or switched off")
        elif [sizes.get(kind) for kind in ("Comm", "Datatype", "Request")] != [8] * 3 \
                or sizes["Status"] > 64:  # mpi_kernels.STATUS_WORDS
            _built.update(module=None, why=f"MPI's handles are not pointers ({sizes})")
        else:
            try:
                import llvmlite.binding
                llvmlite.binding.load_library_permanently(MPI.__file__)  # its MPI symbols
                from . import mpi_kernels
                _check(mpi_kernels, MPI)
                _built.update(module=mpi_kernels, why="")
            except Exception as exc:  # an LLVM, Numba or MPI that cannot run it
                _built.update(module=None, why=f"the compiled swap failed: {exc!r}")
                warnings.warn(f"{_built['why']}; small mpi swaps stay in mpi4py",
                              RuntimeWarning)
    return _built["module"]


def _check(k: Any, MPI: Any) -> None:
    """Compile (or load from Numba's cache) the kernels and swap with this process itself on a
    private communicator: the message must come back whole and judged DONE (a sum folded in
    each order, and a mean), one with another header MISMATCH."""
    comm = MPI.COMM_SELF.Dup()
    try:
        packed, first = np.zeros(HEADER_SIZE + 64, np.uint8), np.zeros(HEADER_SIZE + 64, np.uint8)
        state = _state(k, 0, MPI._handleof(comm), MPI._handleof(MPI.BYTE))
        payload, header = np.arange(5, dtype=np.uint8), bytes(range(HEADER_SIZE))
        code = k.swap(payload, header, packed, first, state)
        sent = header + payload.tobytes()
        if (code, first[:len(sent)].tobytes()) != (k.DONE, sent):
            raise RuntimeError(f"a swap with itself gave {code} and {first[:len(sent)]}")
        if k.poll(header[::-1], first, 5, state) != k.MISMATCH:
            raise RuntimeError("a swap with itself did not see another header")
        for dtype in SUM_DTYPES:
            buf = np.array([1.5, -2.0, 3.0], dtype)
            for mean, expected in ((0, [3.0, -4.0, 6.0]), (2, [1.5, -2.0, 3.0])):
                code = k.swap_sum(buf, header, packed, first, state, 1, True, False, mean)
                if (code, buf.tolist()) != (k.DONE, expected):
                    raise RuntimeError(f"a {dtype.name} sum with itself (mean {mean}) gave "
                                       f"{code} and {buf.tolist()}")
                buf[:] = [1.5, -2.0, 3.0]
    finally:
        comm.Free()


def _state(k: Any, peer: int, comm: int, byte: int) -> np.ndarray:
    """The kernels' state for swaps with ``peer`` on the communicator with handle ``comm``."""
    state = np.zeros(k.STATE_WORDS, np.int64)
    state[[k.PEER, k.TAG, k.COMM, k.BYTE, k.SPIN_NS]] = peer, TAG, comm, byte, SPIN_NS
    return state


class CompiledSwaps:
    """The compiled swaps of one transport: its kernels once hot, its buffers per peer."""

    def __init__(self, t: MpiTransport) -> None:
        self._mode = choice()
        self._kernels: Optional[Any] = None
        self._calls = 0
        self._free: Dict[int, tuple] = {}  # peer -> (packed, first, state), lent to one swap
        self._limit = swap_max_bytes(t.world_size)
        self._first_bytes = first_max_bytes(t.world_size)
        self._handles = (0, 0)  # the communicator's and MPI_BYTE's, once the kernels load

    def takes(self, t: MpiTransport, nbytes: int) -> bool:
        """Whether a swap of ``nbytes`` on ``t`` runs compiled (counting it towards
        HOT_CALLS); the transport's lock is held."""
        if nbytes > self._limit:
            return False
        if self._kernels is None:
            if self._mode == "python":
                return False
            self._calls += 1
            if self._mode == "auto" and self._calls < HOT_CALLS:
                return False
            MPI = t.mpi
            # (a stand-in for mpi4py, as tests use, has no handles to pass)
            self._kernels = kernels(MPI) if hasattr(MPI, "_handleof") else None
            if self._kernels is None:
                self._mode = "python"  # not asked again
                return False
            self._handles = (MPI._handleof(t.comm), MPI._handleof(MPI.BYTE))
        return True

    def _buffers(self, peer: int) -> tuple:
        bufs = self._free.pop(peer, None)
        if bufs is None:
            bufs = (np.empty(HEADER_SIZE + self._limit, np.uint8),
                    np.empty(self._first_bytes, np.uint8),
                    _state(self._kernels, peer, *self._handles))
        return bufs

    def swap(self, t: MpiTransport, sendbuf: np.ndarray, peer: int, fp: Fingerprint,
             use: Callable[[np.ndarray], None]) -> None:
        """``MpiTransport.swap`` of a contiguous ``sendbuf`` that ``takes`` accepted; the
        transport's lock is held. A sum's fold (``mpi_swap.Fold`` of ``np.add`` on float32 or
        float64) runs in the kernel, any other ``use`` after it."""
        k, nbytes = self._kernels, sendbuf.nbytes
        header = pack_header(fp, nbytes)
        bufs = self._buffers(peer)
        packed, first, state = bufs
        folded = (type(use) is Fold and use.combine is np.add and use.buf is sendbuf
                  and sendbuf.dtype in SUM_DTYPES)
        if folded:
            code = k.swap_sum(sendbuf, header, packed, first, state, use.split, use.low,
                              use.high, use.mean)
        else:
            code = k.swap(sendbuf.reshape(-1).view(np.uint8), header, packed, first, state)
        if code != k.DONE:
            self._settle(t, code, bufs, header, peer, fp, nbytes)
            folded = False  # the kernel folds only what it finished
        elif t.look_due():  # the liveness look a wait takes every half second
            t.wait_requests([], fp, (peer,))
        if not folded:
            use(first[HEADER_SIZE:HEADER_SIZE + nbytes].view(sendbuf.dtype))
        self._free[peer] = bufs
    def _settle(self, t: MpiTransport, code: int, bufs: tuple, header: bytes, peer: int,
                fp: Fingerprint, nbytes: int) -> None:
        """Finish a swap the kernel did not: wait for it (PENDING), raise the MPI error
        (negative), or name a message that is not the one expected (MISMATCH)."""
        k, MPI = self._kernels, t.mpi
        packed, first, state = bufs
        flags = state.view(np.int32)
        if code == k.MISMATCH:
            check_first(t, first, int(flags[2 * k.COUNT]), peer, fp, nbytes, True)
            raise AssertionError("check_first passed a message the kernel judged mismatched")
        reqs = [MPI.Request.fromhandle(int(state[w])) for w in (k.RECV, k.SEND)]
        reqs = reqs[:int(state[k.POSTED])]
        arrived = [int(flags[2 * k.COUNT])] if flags[2 * k.FLAGS] else []

        def advance():
            if not arrived:
                if not reqs[0].Test(t.status):
                    return reqs
                arrived.append(t.status.Get_count(MPI.BYTE))
            return None if reqs[1].Test() else reqs[1:]
        try:
            if code < 0:
                t.raise_mpi_error(reqs, fp, (peer,), MPI.Exception(-code))
            t.wait_requests(reqs, fp, (peer,), advance)
        except BaseException:
            t.abandoned.append((reqs, packed, first, state))  # MPI may still use them
            raise
        if not (arrived[0] == HEADER_SIZE + nbytes
                and first[:HEADER_SIZE].tobytes() == header):
            check_first(t, first, arrived[0], peer, fp, nbytes, True)
