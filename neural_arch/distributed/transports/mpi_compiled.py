"""The mpi transport's exchanges in one compiled call each (``mpi_kernels``), from the first
byte posted to the message judged: the two-rank swap, a ``sendrecv``, and the two-rank ring's
two steps, a sum folded in (float32, float64 or int64: ``SUM_DTYPES``).

Through mpi4py every step of an exchange is a Python call (the header packed into a bytearray,
each request a Python object, every ``Test`` and ``Get_count`` a call, the buffers lent and
given back), about ten microseconds around MPI's own two or three for a swap
(``benchmarks/mpi_layers.py``), and the fold that follows is a NumPy call per part. The kernels
take the same steps on the same messages, in one call that releases the GIL; a sum of float32,
float64 or int64 (a ``mpi_swap.Fold`` of ``np.add``: the two-rank all-reduce, a round of recursive
doubling, AVERAGE included) is folded in the same call, any other fold runs after it in
Python. The ring's two steps as one call matter beyond the Python they save: with a NumPy fold
between two compiled ``sendrecv``s the two-rank all-reduce took 236-258 us at 512 KiB, 361-394
at 1 MiB and 950-1013 at 4 MiB, with the fold inside the call 163, 316-346 and 829-881
(``benchmarks/mpi_pair_forms.py``'s ``steps apart`` and ``halves`` rows, two runs in turns on
two cores; not explained). Each rank keeps, per pair of peers, its own send and first-message
buffers as NumPy arrays, the first one sized for any first message of the wire, as
``FirstBuffers``' are.

A round of recursive doubling that the public all-reduce runs many times on one shape is also
prepared once (``round_plan``, for ``MpiTransport.exchange_reduce_plan``): its header made
once, the kernel writing each call's seq into it (``mpi_kernels.round_sum``), the kernel's
machine code called without Numba's type lookup; a 4-byte public all-reduce at p = 2 went from
6.3-6.5 to 3.9 us (``benchmarks/mpi_layers.py``, ``benchmarks/RESULTS.md``).

What is rare goes back to Python: requests not complete within ``mpi_kernel_setup.SPIN_NS`` are
handed to the transport's wait, with its timeout and liveness checks, each of its polls one
more pass of the kernel's poll, and the fold runs in Python after it (the kernels post into the
handles of ``MPI.Request`` objects kept with the buffers, so what MPI completes and frees those
objects see, and a cancel never reaches a request reused since); a message that is not the one
expected is named by ``mpi_wire.check_first``; an MPI error becomes the transport's error. A
call given up leaves its buffers in ``abandoned``, never reused: a receive cancelled may still
land.

Compiled where Numba is installed and MPI's handles are pointers (Open MPI); elsewhere the
exchanges stay in mpi4py. Both forms send the same messages, so ranks on either pair up.
``NEURAL_ARCH_MPI_COMPILED`` = ``python`` never compiles, ``compiled`` loads the kernels at the
first exchange, ``auto`` (the default) after ``HOT_CALLS`` exchanges, so that a job making few
never imports Numba for them (which costs more than a few exchanges save).
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

import numpy as np

from ...backends.numba_entry import fast_entry
from .base import HEADER_SIZE, Fingerprint, pack_header
from .mpi_kernel_setup import SUM_DTYPES, check, kernel_state
from .mpi_swap import Fold
from .mpi_wire import PACKED_MAX_BYTES, check_first, first_max_bytes, swap_max_bytes
from .shm import compiled
from .short_entries import USABLE

if TYPE_CHECKING:
    from .mpi import MpiTransport

ENV_CHOICE = "NEURAL_ARCH_MPI_COMPILED"
HOT_CALLS = compiled.HOT_CALLS
_built: Dict[str, Any] = {}  # "module": ``mpi_kernels`` or None, "why"


def choice() -> str:
    """``auto``, ``python`` or ``compiled``: ``NEURAL_ARCH_MPI_COMPILED``."""
    return compiled.choice(ENV_CHOICE)


def why_not_compiled() -> str:
    """Why the mpi exchanges stay in mpi4py ('' when they are compiled or not tried yet)."""
    return _built.get("why", "")


def loaded() -> bool:
    """Whether this process runs the compiled exchanges (their kernels loaded and checked)."""
    return _built.get("module") is not None


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
                check(mpi_kernels, MPI)
                _built.update(module=mpi_kernels, why="")
            except Exception as exc:  # an LLVM, Numba or MPI that cannot run it
                _built.update(module=None, why=f"the compiled exchanges failed: {exc!r}")
                warnings.warn(f"{_built['why']}; the mpi transport's exchanges stay in mpi4py",
                              RuntimeWarning)
    return _built["module"]


def folds_sum(fold: Any, buf: np.ndarray) -> bool:
    """Whether ``fold`` is a sum into ``buf`` that the kernels fold themselves: a
    ``mpi_swap.Fold`` of ``np.add`` on a vector of a dtype in SUM_DTYPES."""
    return (type(fold) is Fold and fold.combine is np.add and fold.buf is buf
            and buf.ndim == 1 and buf.dtype in SUM_DTYPES)


class CompiledExchanges:
    """The compiled swaps, sendrecvs and prepared rounds of one transport: its kernels once
    hot, its buffers per pair of peers (where to, where from)."""

    def __init__(self, t: MpiTransport) -> None:
        self._mode = choice()
        self._kernels: Optional[Any] = None
        self._calls = 0
        # (dst, src) -> (packed, first, state, requests), lent to one call at a time
        self._free: Dict[tuple, tuple] = {}
        self._limit = swap_max_bytes(t.world_size)
        self._first_bytes = first_max_bytes(t.world_size)
        self._comm = 0  # the communicator's handle, once the kernels load

    def takes(self, t: MpiTransport, nbytes: int, limit: int = 0) -> bool:
        """Whether a swap of ``nbytes`` (a sendrecv: with ``limit`` = CHUNK) on ``t`` runs
        compiled, counting it towards HOT_CALLS; the transport's lock is held."""
        if nbytes > (limit or self._limit):
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
            self._comm = MPI._handleof(t.comm)
        return True

    def _buffers(self, t: MpiTransport, dst: int, src: int) -> tuple:
        bufs = self._free.pop((dst, src), None)
        if bufs is None:
            requests = [t.mpi.Request() for _ in range(4)]
            bufs = (np.empty(HEADER_SIZE + self._limit, np.uint8),
                    np.empty(self._first_bytes, np.uint8),
                    kernel_state(self._kernels, t.mpi, dst, self._comm, requests), requests)
        return bufs

    def swap(self, t: MpiTransport, sendbuf: np.ndarray, peer: int, fp: Fingerprint,
             use: Callable[[np.ndarray], None]) -> None:
        """``MpiTransport.swap`` of a contiguous ``sendbuf`` that ``takes`` accepted; the
        transport's lock is held. A sum's fold (``mpi_swap.Fold`` of ``np.add`` on a dtype in
        ``SUM_DTYPES``) runs in the kernel, any other ``use`` after it."""
        k, nbytes = self._kernels, sendbuf.nbytes
        header = pack_header(fp, nbytes)
        bufs = self._buffers(t, peer, peer)
        packed, first, state, _ = bufs
        folded = folds_sum(use, sendbuf)
        if folded:
            code = k.swap_sum(sendbuf, header, packed, first, state, use.split, use.low,
                              use.high, use.mean)
        else:
            code = k.swap(sendbuf.reshape(-1).view(np.uint8), header, packed, first, state)
        self._settle(t, code, bufs, fp, peer, header, nbytes, sendbuf.dtype, use, folded)
        self._free[(peer, peer)] = bufs

    def round_plan(self, t: MpiTransport, peer: int, dtype: np.dtype, count: int,
                   theirs_first: bool, mean: int) -> Optional[Callable[..., bool]]:
        """``go(buf, fp)``: the swap and sum of a round of recursive doubling with
        ``peer`` (``MpiTransport.exchange_reduce_plan``) for every ``buf`` of ``count``
        elements of ``dtype`` (in SUM_DTYPES), divided by ``mean`` unless 0, in one compiled
        call (``mpi_kernels.round_sum``) with what the calls share made once: the header (but
        its seq, which the kernel writes), the kernel's machine-code entry (no type lookup per
        call: ``buf`` is checked to be of the type it was made for). True once run; False,
        nothing sent, while the kernels are not loaded or for a ``buf`` of another type: the
        caller runs ``swap`` instead. None where the exchanges stay in mpi4py. Called with the
        transport's lock held and ``peer`` checked."""
        if self._mode == "python":
            return None
        # the dtype object arrays of this type usually carry (one made by unpickling or with
        # metadata is another object, equal: checked by value, a little slower)
        dtype = next(d for d in SUM_DTYPES if d == dtype)
        shape, nbytes, low = (count,), count * dtype.itemsize, bool(theirs_first)
        free, key, look_due = self._free, (peer, peer), t.look_due
        made: list = [None, None]  # the fingerprint's fixed words, the header
        entry: Any = None

        def go(buf: np.ndarray, fp: Fingerprint) -> bool:
            nonlocal entry
            k = self._kernels
            if (k is None or type(buf) is not np.ndarray or buf.shape != shape
                    or buf.flags.num & USABLE != USABLE
                    or (buf.dtype is not dtype and buf.dtype != dtype)):
                return False
            fixed, header = made
            if fixed != (fp[0], fp[2], fp[3], fp[4]):  # another caller's names: a new header
                header = np.frombuffer(pack_header(fp, nbytes), np.uint8).copy()
                made[:] = (fp[0], fp[2], fp[3], fp[4]), header
            bufs = free.pop(key, None) or self._buffers(t, peer, peer)
            packed, first, state, _ = bufs
            if entry is None:
                entry = fast_entry(k.round_sum, buf, header, fp[1], packed, first, state,
                                   low, mean)
            code = entry(buf, header, fp[1], packed, first, state, low, mean)
            if code != k.DONE or look_due():  # with this call's seq, as the kernel sent it
                self._settle(t, code, bufs, fp, peer, bytes(header), nbytes, dtype,
                             Fold.of_round(buf, np.add, low, mean), True)
            free[key] = bufs
            return True
        return go

    def _settle(self, t: MpiTransport, code: int, bufs: tuple, fp: Fingerprint, peer: int,
                header: bytes, nbytes: int, dtype: np.dtype, use: Callable[[np.ndarray], None],
                folded: bool) -> None:
        """After a kernel's swap of ``nbytes`` with ``header``: the liveness look when due
        (DONE), else finish the swap; then ``use`` the peer's vector (of ``dtype``) unless the
        kernel ``folded`` it (it folds only what it finished)."""
        if not self._done(t, code, fp, peer):
            k, first, state = self._kernels, bufs[1], bufs[2]
            self._finish(t, code, bufs, (), fp, peer, nbytes, True,
                         lambda spin: k.poll(header, first, nbytes, state, spin))
            folded = False
        if not folded:
            use(bufs[1][HEADER_SIZE:HEADER_SIZE + nbytes].view(dtype))

    def sendrecv(self, t: MpiTransport, sendbuf: np.ndarray, dst: int, recvbuf: np.ndarray,
                 src: int, fp: Fingerprint) -> None:
        """``MpiTransport.sendrecv`` of contiguous arrays that ``takes`` accepted (checked
        peers); the transport's lock is held."""
        k = self._kernels
        send, recv = sendbuf.reshape(-1).view(np.uint8), recvbuf.reshape(-1).view(np.uint8)
        header = pack_header(fp, send.size)
        expected = header if recv.size == send.size else pack_header(fp, recv.size)
        bufs = self._buffers(t, dst, src)
        packed, first, state, _ = bufs
        code = k.sendrecv(send, header, packed, dst, recv, expected, first, src, state)
        self._finish_sendrecv(t, code, bufs, (send, recv), fp, src, expected, recv)
        self._free[(dst, src)] = bufs

    def ring_steps(self, t: MpiTransport, mine: np.ndarray, theirs: np.ndarray,
                   got: np.ndarray, fp: Fingerprint, fold: Fold) -> None:
        """``MpiTransport.ring_steps`` with a sum's ``fold`` (``folds_sum``) that
        ``takes`` accepted; the transport's lock is held."""
        k, peer = self._kernels, 1 - t.rank
        to_peer, from_peer = pack_header(fp, theirs.nbytes), pack_header(fp, mine.nbytes)
        bufs = self._buffers(t, peer, peer)
        packed, first, state, _ = bufs
        code = k.ring_steps(mine, theirs, got, to_peer, from_peer, packed, first, peer, state,
                            fold.mean)
        if code != k.DONE and state[k.STEP] == 1:  # the first step, not folded
            self._finish_sendrecv(t, code, bufs, (theirs, got), fp, peer, from_peer,
                                  got.view(np.uint8))
            fold(got)
            self._free[(peer, peer)] = bufs
            self.sendrecv(t, mine, peer, theirs, peer, fp)
            return
        self._finish_sendrecv(t, code, bufs, (mine, theirs), fp, peer, to_peer,
                              theirs.view(np.uint8))
        self._free[(peer, peer)] = bufs

    def _finish_sendrecv(self, t: MpiTransport, code: int, bufs: tuple, arrays: tuple,
                         fp: Fingerprint, src: int, expected: bytes, recv: np.ndarray) -> None:
        """``_finish`` of a kernel's ``sendrecv`` from ``src`` into ``recv`` (bytes), whose
        first message must be ``expected``."""
        if self._done(t, code, fp, src):
            return
        k, first, state = self._kernels, bufs[1], bufs[2]
        self._finish(t, code, bufs, arrays, fp, src, recv.size, recv.size <= PACKED_MAX_BYTES,
                     lambda spin: k.poll_sendrecv(expected, first, recv, src, state, spin))

    def _done(self, t: MpiTransport, code: int, fp: Fingerprint, src: int) -> bool:
        """Whether the kernel finished the call (DONE), then with the liveness look a wait
        takes every half second, when due."""
        if code != self._kernels.DONE:
            return False
        if t.look_due():
            t.wait_requests([], fp, (src,))
        return True

    def _finish(self, t: MpiTransport, code: int, bufs: tuple, arrays: tuple,
                fp: Fingerprint, src: int, nbytes: int, packed: bool,
                poll: Callable[[int], int]) -> None:
        """Finish a call the kernel did not: wait for it (PENDING, each poll one ``poll(0)``),
        raise an MPI error (negative), or name a first message from ``src`` that is not the
        ``nbytes`` one expected (MISMATCH). On any failure the buffers and ``arrays`` stay in
        ``abandoned``: MPI may still use them."""
        k, MPI, state, requests = self._kernels, t.mpi, bufs[2], bufs[3]
        flags = state.view(np.int32)

        def outstanding() -> list:
            # the kernel posts into these objects' handles, and MPI nulls a handle it
            # completes: a cancel never reaches a request freed and reused since
            posted = int(state[k.POSTED])
            return [requests[r] for r in range(4)
                    if posted >> r & 1 and not flags[2 * k.FLAGS + r]]
        last = [code]

        def advance():
            if last[0] == k.PENDING:  # a wait may poll again after it was told "done"
                last[0] = poll(0)
            return outstanding() if last[0] == k.PENDING else None
        try:
            if code == k.PENDING:
                t.wait_requests(outstanding(), fp, (src,), advance)
            if last[0] < 0:
                t.raise_mpi_error(outstanding(), fp, (src,), MPI.Exception(-last[0]))
            if last[0] == k.MISMATCH:
                check_first(t, bufs[1], int(flags[2 * k.COUNT]), src, fp, nbytes, packed)
                raise AssertionError("check_first passed a message the kernel refused")
        except BaseException:
            t.abandoned.append(bufs + arrays)  # MPI may still use them
            raise
