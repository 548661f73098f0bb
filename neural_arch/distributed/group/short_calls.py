"""The public calls' short path on a default group whose transport has none of its own (mpi,
tcp): one entry per shape of a synchronous all-reduce, broadcast, all-gather into a tensor or
reduce-scatter of a tensor of NumPy arrays, and one for the barrier, each running the algorithm
the general path would run, without the layers above it.

On a 4-byte all-reduce over MPI the layers between ``dist.all_reduce`` and its algorithm (the
group's lookup and checks, the argument checks, the fingerprint, the choice of algorithm, the
profiler hook, the queue) cost about as much as the algorithm's own Python. The public calls
(``collectives``) look up an entry here instead, keyed by what must match for it to apply
(dtype, element count and op, or root; the group is the default one), made once a first call
of that shape passed the checks the general path makes of what the shape tells (dtype, op,
root). A call of an entry checks what only the arrays can tell (contiguous, aligned, writable;
for an all-gather or reduce-scatter the output's dtype and size; otherwise it declines and the
general path runs, raising where it must), takes the group's next sequence number, makes the
same fingerprint the general path makes, waits for queued async work and takes the queue's lock
(``CommQueue.run_sync``, inlined), then runs the algorithm: the plan
``algorithms.all_reduce_plan``, ``broadcast_plan``, ``all_gather_plan`` or
``reduce_scatter_plan`` chose once for the shape, as the general path chooses per call; a
barrier calls ``algorithms.barrier``, whose choice costs little beside the checks it makes.
Every message still carries the fingerprint, every wait its timeout.

``world`` makes one ``ShortCalls`` per default group and forgets its entries when the group is
destroyed, so none outlives the transport it runs on.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from .. import algorithms
from ..errors import PeerFailureError
from ..health import heartbeat
from ..reduce_ops import SUPPORTED_DTYPES, check_dtype_for_op
from ..transports.base import Fingerprint
from ..transports.short_entries import USABLE as _USABLE, EntryTables, two_arrays
from .process_group import ProcessGroup

# ``Fingerprint(...)`` at C speed, as ``ProcessGroup.fingerprint`` makes it
_new_fingerprint = tuple.__new__


class ShortCalls(EntryTables):
    """The entries of the default group ``pg``; ``bind`` and the ``*_entry`` methods are what
    the public calls ask of any transport's short calls (shared memory's are its own)."""

    def __init__(self, pg: ProcessGroup) -> None:
        self.pg = pg
        super().__init__()

    def bind(self, pg: Any) -> bool:
        """Whether these entries serve ``pg`` (the default group, not destroyed)."""
        return pg is self.pg and not pg.destroyed

    # ----- making entries ----------------------------------------------------------------
    def all_reduce_entry(self, tensor: np.ndarray, op: Any, op_code: str) -> Optional[Callable]:
        """The entry of ``tensor``'s shape and ``op``; None where the general path must raise
        (a dtype collectives or ``op`` do not take)."""
        dtype, n = tensor.dtype, tensor.size
        if dtype.type not in SUPPORTED_DTYPES:
            return None
        try:
            check_dtype_for_op(dtype, op)
        except TypeError:
            return None
        self.make_room(self.all_reduce)
        plan = algorithms.all_reduce_plan(self.pg.transport, dtype, tensor.nbytes, op)
        entry = self.all_reduce[(dtype, n, op)] = self._entry(
            plan, "all_reduce", f"all_reduce:{op_code}", dtype, n)
        return entry

    def broadcast_entry(self, tensor: np.ndarray, root: int) -> Optional[Callable]:
        """The entry of ``tensor``'s shape from ``root``; None where the general path must raise
        (a root outside the group, a dtype collectives do not take)."""
        dtype, n = tensor.dtype, tensor.size
        if not 0 <= root < self.pg.size or dtype.type not in SUPPORTED_DTYPES:
            return None
        self.make_room(self.broadcast)
        plan = algorithms.broadcast_plan(self.pg.transport, dtype, n, root)
        entry = self.broadcast[(dtype, n, root)] = self._entry(
            plan, "broadcast", f"broadcast:{root}", dtype, n)
        return entry

    def all_gather_entry(self, src: np.ndarray) -> Optional[Callable]:
        """The entry of an all-gather into a tensor sending ``src``'s shape, called as
        ``entry(src, out)``; None for a dtype collectives do not take."""
        dtype, n = src.dtype, src.size
        if dtype.type not in SUPPORTED_DTYPES:
            return None
        self.make_room(self.all_gather)
        plan = algorithms.all_gather_plan(self.pg.transport, dtype, n)
        run = self._synced(plan, "all_gather_into_tensor", "all_gather", dtype, n)
        entry = self.all_gather[(dtype, n)] = two_arrays(run, dtype, n * self.pg.size)
        return entry

    def reduce_scatter_entry(self, src: np.ndarray, op: Any, op_code: str
                             ) -> Optional[Callable]:
        """The entry of a reduce-scatter of a tensor whose input has ``src``'s shape, with
        ``op``, called as ``entry(src, out)``; None where the general path must raise or has
        nothing to send (a dtype or op collectives do not take, an input that does not split
        evenly over the group, an empty one)."""
        dtype, n, size = src.dtype, src.size, self.pg.size
        if dtype.type not in SUPPORTED_DTYPES or n == 0 or n % size:
            return None
        try:
            check_dtype_for_op(dtype, op)
        except TypeError:
            return None
        self.make_room(self.reduce_scatter)
        plan = algorithms.reduce_scatter_plan(self.pg.transport, dtype, n, op)
        run = self._synced(plan, "reduce_scatter", f"reduce_scatter:{op_code}", dtype, n)
        entry = self.reduce_scatter[(dtype, n, op)] = two_arrays(run, dtype, n // size)
        return entry

    def barrier_entry(self) -> Callable[[], bool]:
        t = self.pg.transport
        run = self._entry(lambda buf, fp: algorithms.barrier(t, fp), "barrier", "barrier",
                          np.uint8, 0)
        self.barrier = lambda: run(None)
        return self.barrier

    # ----- the entries ---------------------------------------------------------------------
    def _entry(self, run: Callable[[Any, Fingerprint], Any], op: str, name: str, dtype: Any,
               count: int) -> Callable[[Optional[np.ndarray]], bool]:
        """An entry running ``run(buf, fingerprint)`` as ``ProcessGroup.run_now`` runs the
        general path's call; it declines (False) an array the general path must stage or
        refuse. ``buf`` None: the barrier."""
        synced = self._synced(run, op, name, dtype, count)

        def call(tensor: Optional[np.ndarray]) -> bool:
            if tensor is None:
                buf = None
            elif tensor.flags.num & _USABLE != _USABLE:
                return False
            else:
                buf = tensor if tensor.ndim == 1 else tensor.reshape(-1)
            synced(buf)
            return True
        return call

    def _synced(self, run: Callable[..., Any], op: str, name: str, dtype: Any,
                count: int) -> Callable[..., None]:
        """``go(*bufs)``: ``run(*bufs, fingerprint)`` as ``ProcessGroup.run_now`` runs the
        general path's call, with the group's next sequence number."""
        pg = self.pg
        queue, next_seq = pg.queue, pg.next_seq
        acquire, release = queue.exec_lock.acquire, queue.exec_lock.release
        op_name, dtype_name, count, group_id = name[:24], np.dtype(dtype).name, int(count), \
            pg.group_id

        def go(*bufs: Optional[np.ndarray]) -> None:
            seq = next_seq()
            fp = _new_fingerprint(Fingerprint, (op_name, seq, dtype_name, count, group_id))
            queue.drain(op, seq)  # CommQueue.run_sync, inlined; at once when nothing is queued
            acquire()
            try:
                run(*bufs, fp)
            except PeerFailureError as exc:  # as ProcessGroup.run_now: peers name the culprit
                heartbeat.report(exc)
                raise
            finally:
                release()
        return go
