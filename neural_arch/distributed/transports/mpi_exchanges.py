"""The mpi transport's two-rank exchanges and prepared rounds (``PairExchanges``, a part of
``MpiTransport``): the swap of whole vectors (``mpi_swap``), the two-rank ring's two steps
(``mpi_pair``), the ring all-reduce they make at two ranks, a round of recursive doubling as a
swap, and that round prepared once per shape for the public all-reduce's plan; each in one
compiled call once hot (``mpi_compiled``), the same messages as the mpi4py forms.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from .base import Fingerprint
from .mpi_wire import CHUNK, swap_max_bytes
from . import mpi_compiled, mpi_pair, mpi_swap


def byte_view(buf: np.ndarray, writable: bool, what: str) -> memoryview:
    """``buf``'s bytes for MPI; TypeError or ValueError naming what it is where it cannot be
    sent (or, ``writable``, received into) as it is."""
    if not isinstance(buf, np.ndarray):
        raise TypeError(f"{what} buffer must be a numpy array, got {type(buf).__name__}")
    flags = buf.flags
    if not flags.c_contiguous or (writable and not flags.writeable):
        raise ValueError(f"{what} buffer must be C-contiguous{' and writable' if writable else ''}"
                         f"; got shape {buf.shape}, strides {buf.strides}")
    try:
        return memoryview(buf).cast("B")
    except (TypeError, ValueError):  # a dtype the buffer protocol cannot describe
        return memoryview(buf.reshape(-1).view(np.uint8))


def compilable(buf) -> bool:
    """Whether the compiled exchanges (``mpi_compiled``) may take ``buf`` as it is: a
    contiguous, writable array of plain values (a read-only one would compile another form of
    the kernels in the middle of a call; anything else goes where it is checked)."""
    return (type(buf) is np.ndarray and buf.flags.c_contiguous and buf.flags.writeable
            and not buf.dtype.hasobject)


class PairExchanges:
    """The exchanges of ``MpiTransport`` between two ranks, a part of that class: they use
    its lock (``_lock``), compiled forms (``_compiled``), communicator (``_comm``), peers
    marked unusable (``_unusable``), ``rank``, ``world_size``, ``check_peer`` and
    ``sendrecv``."""

    def swap(self, sendbuf: np.ndarray, peer: int, fp: Fingerprint,
             use: Callable[[np.ndarray], None]) -> None:
        """Two ranks exchange vectors of the same size and dtype, up to
        ``mpi_wire.SWAP_MAX_BYTES``, one message each way; ``use(received)`` reads the peer's
        where it landed, before that buffer is reused (``mpi_swap``, or in one compiled call
        once hot: ``mpi_compiled``)."""
        plain = compilable(sendbuf)
        with self._lock:
            self.check_peer(peer, fp)
            if plain and self._compiled.takes(self, sendbuf.nbytes):
                self._compiled.swap(self, sendbuf, peer, fp, use)
            else:
                mpi_swap.swap(self, sendbuf, byte_view(sendbuf, False, "send"), peer, fp, use)

    def ring_steps(self, mine: np.ndarray, theirs: np.ndarray, got: np.ndarray,
                   fp: Fingerprint, fold: Callable[[np.ndarray], None]) -> None:
        """The two-rank ring's two steps (``mpi_pair``): ``theirs`` to the peer while the
        peer's part of ``mine`` lands in ``got``, ``fold(got)`` into ``mine``, then ``mine``
        to the peer while the peer's part of ``theirs`` lands there: two ``sendrecv``s, or,
        once hot, for a sum (SUM_DTYPES), one compiled call (``mpi_compiled``), the same
        messages."""
        peer = 1 - self.rank
        with self._lock:
            self.check_peer(peer, fp)
            if (mpi_compiled.folds_sum(fold, mine) and theirs.dtype == mine.dtype == got.dtype
                    and all(compilable(a) and a.ndim == 1 for a in (mine, theirs, got))
                    and self._compiled.takes(self, max(mine.nbytes, theirs.nbytes), CHUNK)):
                self._compiled.ring_steps(self, mine, theirs, got, fp, fold)
                return
        self.sendrecv(theirs, peer, got, peer, fp)
        fold(got)
        self.sendrecv(mine, peer, theirs, peer, fp)

    def ring_all_reduce(self, buf: np.ndarray, op, fp: Fingerprint, mean: int = 0) -> bool:
        """The ring all-reduce (``algorithms.ring``) run here, with its bits, when this
        transport has a faster way: two ranks swap small vectors whole and exchange large
        ones by whole halves (``mpi_pair``). False: not here."""
        if self.world_size != 2:
            return False
        mpi_pair.all_reduce(self, buf, op, fp, mean)
        return True

    def exchange_reduce(self, buf: np.ndarray, peer: int, fp: Fingerprint,
                        combine: Callable, theirs_first: bool) -> bool:
        """A round of recursive doubling as a ``swap`` up to the swap's limit
        (the fold and why: ``mpi_swap.Fold``)."""
        if buf.nbytes > swap_max_bytes(self.world_size):
            return False
        self.swap(buf, peer, fp, mpi_swap.Fold.of_round(buf, combine, theirs_first))
        return True

    def exchange_reduce_plan(self, peer: int, dtype: np.dtype, count: int, combine: Callable,
                             theirs_first: bool, mean: int = 0) -> Optional[Callable]:
        """A sum's round (``mpi_compiled.SUM_DTYPES``) up to the swap's limit, in one compiled
        call from here once the kernels are loaded (``CompiledExchanges.round_plan``), else
        the swap; None for other folds and sizes, or where the exchanges stay in mpi4py."""
        dtype = np.dtype(dtype)
        if (combine is not np.add or dtype not in mpi_compiled.SUM_DTYPES
                or count * dtype.itemsize > swap_max_bytes(self.world_size)):
            return None
        compiled = self._compiled.round_plan(self, peer, dtype, count, theirs_first, mean)
        if compiled is None:
            return None
        lock, unusable = self._lock, self._unusable

        def run(buf: np.ndarray, fp: Fingerprint) -> None:
            with lock:
                if self._comm is None or peer in unusable:
                    self.check_peer(peer, fp)  # raises
                if compiled(buf, fp):
                    return
            self.swap(buf, peer, fp, mpi_swap.Fold.of_round(buf, np.add, theirs_first, mean))
        return run
