"""The public calls' short path on shared memory: one prepared call per shape of the default
group's synchronous all-reduce and broadcast of a NumPy array, and of its barrier; and an entry
per shape of its all-gather and reduce-scatter into a tensor (``two_array_calls``).

A 4-byte ``dist.all_reduce`` used to cost several times its barrier, nearly all of it in
Python around the compiled plan: checking the arguments, making a fingerprint, taking the
general path's layers (the group, the queue, the plan's own checks), and handing Numba twelve
arguments. The public calls (``collectives``) look up an *entry* here instead, keyed by what
must match for it to apply (dtype, element count and op, or root; the group is the default
one), made once per shape from that shape's plan (``plans``) and its fingerprint. A call of an
entry checks what only the array can tell (contiguous, writable, aligned), takes the group's
next sequence number, waits for queued async work and takes the queue's lock (what
``CommQueue.run_sync`` does, inlined), and makes one compiled call (``entry_kernels``): the
signature, the header check, the barrier, the peers' fingerprints and the reduction all happen
there. The fingerprint itself is made only when the kernel returns a status (a header to
write, a late peer, a mismatch), so errors name the same things as on the general path. A
compiled entry of a typed array, and the compiled barrier's, also go into the group's C tables
(``entry_table``, where built), which the public calls try first: the same steps without the
Python around them.

While a plan is still in Python (before ``compiled.HOT_CALLS`` calls, or when compiling is
off), its entry runs the Python form with a fingerprint, and changes to the compiled entry once
the plan has. The barrier has no Python plan: the general path serves it until HOT_CALLS
barriers were made, then the compiled barrier does. A shape too large for any plan gets an
entry too, which calls the transport's collective the general path would end in, without the
layers above it. Entries are dropped when the transport closes (``ShmCollectives.close``), so
none outlives the mapping its addresses point into.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ....backends.numba_entry import fast_entry
from ...errors import PeerFailureError
from ...health import heartbeat
from ...reduce_ops import SUPPORTED_DTYPES
from .. import entry_table
from ..base import Fingerprint
from ..short_entries import USABLE as _USABLE, EntryTables
from . import compiled
from .two_array_calls import TwoArrayCalls, reducible


class ShortCalls(TwoArrayCalls, EntryTables):
    """The entries of one ``ShmCollectives``, for its default group ``pg`` (``bind``); those
    of the all-gather and reduce-scatter into a tensor are ``TwoArrayCalls``'."""

    def __init__(self, c: Any) -> None:
        self.c = c
        self.pg: Any = None
        self.barrier_calls = 0
        self.barrier_mode: Optional[str] = None  # compiled.choice(), once asked
        self.use_c = entry_table.enabled()  # a bad NEURAL_ARCH_SHORT_C fails the set-up
        super().__init__()

    def bind(self, pg: Any) -> bool:
        """Serve ``pg`` (the default group over this transport); False once closed."""
        if self.c.closed:
            return False
        if pg is not self.pg:
            self.clear()
            self.pg = pg
            if self.use_c:
                self.c_tables = entry_table.tables(pg, self.c.t.watch)
                self.all_reduce_now, self.broadcast_now = (t.run for t in self.c_tables[:2])
                self.barrier_now = self.c_tables[2].run_alone
                self.all_gather_now = self.c_tables[3].run_pair
        return True

    # ----- making entries ----------------------------------------------------------------
    def all_reduce_entry(self, tensor: np.ndarray, op: Any, op_code: str) -> Optional[Callable]:
        """The entry of ``tensor``'s shape and ``op`` once its plan exists, else None."""
        dtype = tensor.dtype
        general = tensor.nbytes > self.c.small_bytes() and reducible(dtype, op)
        return self._made("all_reduce", ("all_reduce", dtype, tensor.size, op), op,
                          f"all_reduce:{op_code}", tensor, general)

    def broadcast_entry(self, tensor: np.ndarray, root: int) -> Optional[Callable]:
        """The entry of ``tensor``'s shape from ``root`` once its plan exists, else None."""
        general = (tensor.nbytes > self.c.broadcast_plan_bytes
                   and tensor.dtype.type in SUPPORTED_DTYPES)
        return self._made("broadcast", ("broadcast", tensor.nbytes, root), root,
                          f"broadcast:{root}", tensor, general)

    def _made(self, collective: str, plan_key: tuple, how: Any, name: str, tensor: np.ndarray,
              general: bool) -> Optional[Callable]:
        """The entry of ``collective`` (all_reduce or broadcast) for ``tensor``'s shape and
        ``how`` (the op or the root), kept in that table: from its plan where there is one,
        else the transport's collective where ``general`` (a shape too large for any plan,
        which the collectives take), else None (a plan may come; an error is the general
        path's)."""
        run = self.c.plans.get(plan_key)
        table = getattr(self, collective)
        self.make_room(table)
        if run is None and not general:
            return None
        dtype, n = tensor.dtype, tensor.size
        fp = Fingerprint(name, 0, dtype.name, n, self.pg.group_id)
        key = (dtype, n, how)
        if run is None:
            entry = table[key] = self._general(getattr(self.c, collective), how, fp)
        else:
            entry = table[key] = self._entry(run, plan_key, key, fp, tensor, collective)
        return entry

    def _add_c_entry(self, op: str, like: Optional[np.ndarray], how: Any, kernel: Any,
                     address: int, finish: Callable, plan: np.ndarray) -> None:
        """The compiled entry of ``like``'s shape and ``how`` (the op, the root, an
        all-gather's output length; the barrier: no ``like``) in the C table of ``op`` too
        (``entry_table``), where this group has one."""
        if self.c_tables is not None:
            table = self.c_tables[list(entry_table.OPS).index(op)]
            dtype, size = (None, 0) if like is None else (like.dtype, like.size)
            if dtype is not None and np.dtype(dtype.type) == dtype:
                # NumPy's own dtype object, which most arrays share: the C table finds an entry
                # by identity, and the first array may hold an equal copy (one unpickled)
                dtype = np.dtype(dtype.type)
            table.add(dtype, size, how, kernel, address, entry_table.finisher(finish), plan)

    def barrier_entry(self) -> Optional[Callable[[], bool]]:
        """The compiled barrier's entry once HOT_CALLS barriers asked (at once when compiling
        is forced), else None (also where it cannot be compiled)."""
        if self.barrier_mode is None:  # asked once: it reads the environment
            self.barrier_mode = compiled.choice() if compiled.allowed() else "python"
        self.barrier_calls += 1
        if self.barrier_mode == "python" or (self.barrier_mode == "auto"
                                             and self.barrier_calls < compiled.HOT_CALLS):
            return None
        prepared = compiled.barrier(self.c)
        if prepared is None:  # Numba failed: the general path serves every barrier
            self.barrier_mode = "python"
            return None
        fp = Fingerprint("barrier", 0, "uint8", 0, self.pg.group_id)
        self.barrier = self._compiled(prepared, fp, None, "barrier")
        return self.barrier

    def _entry(self, run: Any, plan_key: tuple, key: tuple, fp: Fingerprint, like: np.ndarray,
               op: str) -> Callable[[np.ndarray], bool]:
        prepared = getattr(run, "prepared", None)
        if prepared is not None:
            return self._compiled(prepared, fp, like, op, key[2])
        return self._python(plan_key, key, fp, op)

    # ----- the entries ---------------------------------------------------------------------
    def _general(self, collective: Callable, how: Any, fp: Fingerprint) -> Callable:
        """An entry for a shape larger than any plan: the transport's own collective
        (``ShmCollectives.all_reduce`` or ``broadcast``, with ``how``: the op or the root), as
        the general path ends in it, without the layers above (about 7 us a call at 1 MiB:
        4-5% of its time)."""
        run = self._synced(collective, how, fp)

        def call(tensor: np.ndarray) -> bool:
            if tensor.flags.num & _USABLE != _USABLE:
                return False
            run(tensor if tensor.ndim == 1 else tensor.reshape(-1))
            return True
        return call

    def _synced(self, collective: Callable, how: Any, fp: Fingerprint) -> Callable[..., None]:
        """``go(*bufs)``: ``collective(*bufs, how, fingerprint)`` with the group's next
        sequence number, as ``ProcessGroup.run_now`` runs the general path's call."""
        pg, op = self.pg, fp.op.split(":")[0]
        next_seq, queue = pg.next_seq, pg.queue
        acquire, release = queue.exec_lock.acquire, queue.exec_lock.release

        def go(*bufs: np.ndarray) -> None:
            seq = next_seq()
            queue.drain(op, seq)  # CommQueue.run_sync, inlined, as below
            acquire()
            try:
                collective(*bufs, how, fp._replace(seq=seq))
            except PeerFailureError as exc:  # as ProcessGroup.run_now: peers name the culprit
                heartbeat.report(exc)
                raise
            finally:
                release()
        return go

    def _python(self, plan_key: tuple, key: tuple, fp: Fingerprint,
                op: str) -> Callable[[np.ndarray], bool]:
        """An entry running the plan's Python form; it hands over to the compiled entry (under
        ``key``) once the plan has changed to its compiled form."""
        plans, pg, table = self.c.plans, self.pg, getattr(self, op)
        as_bytes = op == "broadcast"

        def call(tensor: np.ndarray) -> bool:
            run = plans.get(plan_key)
            if run is None:  # the plans started afresh: the general path makes it again
                return False
            flags = tensor.flags
            if not (flags.c_contiguous and flags.writeable):
                return False
            prepared = getattr(run, "prepared", None)
            if prepared is not None:
                entry = table[key] = self._compiled(prepared, fp, tensor, op, key[2])
                return entry(tensor)
            buf = tensor.reshape(-1)
            seq = pg.next_seq()
            pg.run_now(run, op, seq, buf.view(np.uint8) if as_bytes else buf,
                       fp._replace(seq=seq))
            return True
        return call

    def _kernel(self, prepared: Any, fp: Fingerprint, arrays: tuple) -> tuple:
        """(kernel, plan words, their address, finish): the compiled call of ``prepared``
        with ``fp``'s signature, taking arrays of the types of ``arrays`` (none: the
        barrier); ``finish(status, args, seq)`` settles a status the kernel returned."""
        c = self.c
        sig = c.signature(fp, prepared.nbytes)
        plan = prepared.words(sig)
        address, settle = plan.ctypes.data, prepared.settle

        def finish(status: int, args: tuple, seq: int) -> None:
            try:
                settle(status, args, address, fp._replace(seq=seq), sig)
            except PeerFailureError as exc:  # as ProcessGroup.run_now: peers name the culprit
                heartbeat.report(exc)
                raise

        return fast_entry(prepared.kernel, *arrays, address, 0, 1), plan, address, finish

    def _compiled(self, prepared: Any, fp: Fingerprint, like: Optional[np.ndarray],
                  op: str, how: Any = None) -> Callable[..., bool]:
        """An entry making one compiled call (see the module docstring); one of a typed
        array's (not the barrier's, not bytes) goes into the C table too, with ``how``."""
        pg, watch = self.pg, self.c.t.watch
        next_seq, queue = pg.next_seq, pg.queue
        acquire, release = queue.exec_lock.acquire, queue.exec_lock.release

        if like is None:  # the barrier
            kernel, plan, address, finish = self._kernel(prepared, fp, ())

            def barrier() -> bool:
                seq = next_seq()
                queue.drain(op, seq)  # returns at once when nothing is queued
                acquire()
                try:
                    status = kernel(address, seq, watch.spin_polls)
                    if status:
                        finish(status, (), seq)
                finally:
                    release()
                return True
            barrier.plan = plan  # the plan words live as long as the entry
            self._add_c_entry(op, None, None, kernel, address, finish, plan)
            return barrier

        # Numba has no float16 arrays, nor other byte orders: a broadcast takes their bytes
        as_bytes = like.dtype.type is np.float16 or not like.dtype.isnative
        sample = np.zeros(like.size, like.dtype)
        kernel, plan, address, finish = self._kernel(
            prepared, fp, (sample.view(np.uint8) if as_bytes else sample,))

        def call(tensor: np.ndarray) -> bool:
            if tensor.flags.num & _USABLE != _USABLE:
                return False
            buf = tensor if tensor.ndim == 1 else tensor.reshape(-1)
            if as_bytes:
                buf = buf.view(np.uint8)
            seq = next_seq()
            queue.drain(op, seq)  # CommQueue.run_sync, inlined; at once when nothing is queued
            acquire()  # not ``with lock``: this costs about 0.09 us less
            try:
                status = kernel(buf, address, seq, watch.spin_polls)
                if status:
                    finish(status, (buf,), seq)
            finally:
                release()
            return True
        call.plan = plan
        if not as_bytes:
            self._add_c_entry(op, like, how, kernel, address, finish, plan)
        return call
