"""Shared memory's short-path entries for the collectives from one array into another: the
all-gather into a tensor and the reduce-scatter of a tensor, each called as
``entry(src, out)`` and keyed by the input's shape (and the reduce-scatter's op).

**All-gather.** A small all-gather has a plan of its own (``plans``, one generation). While the
plan is in Python its entry runs it, as the general path's last layer would; once the plan is
compiled, the entry makes the plan's compiled call itself (``entry_kernels.planned_all_gather``
on the two arrays, whose bytes it moves), with the all-gather's fingerprint: the checks, the
fingerprint, the queue's layers and the plan's Python are gone from every call. A larger one
calls the transport's all-gather, as the general path ends in it.

**Reduce-scatter.** It has no plan of its own: its entry calls the transport's reduce-scatter
once it found the output of the input's dtype holding its part, except for a small input,
which the transport runs as the all-reduce of a copy: once that all-reduce's plan is
compiled, the entry makes the plan's compiled call on a copy of its own, taken after queued
async work finished and under the queue's lock.

Either way, the same generation, signature and bits as the general path: a rank on an entry
and a rank on the general path meet in the same call. These are methods of ``ShortCalls``
(``short_calls``), which holds the tables, the group and the compiled calls' making.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ...reduce_ops import SUPPORTED_DTYPES, check_dtype_for_op
from ..base import Fingerprint
from ..short_entries import USABLE, two_arrays
from . import compiled


def reducible(dtype: np.dtype, op: Any) -> bool:
    """Whether the collectives reduce ``dtype`` with ``op`` (else the general path raises)."""
    try:
        check_dtype_for_op(dtype, op)
    except TypeError:
        return False
    return True


class TwoArrayCalls:
    """``all_gather_entry`` and ``reduce_scatter_entry`` of ``ShortCalls`` (see the module
    docstring)."""

    # ----- all-gather ------------------------------------------------------------------------
    def all_gather_entry(self, src: np.ndarray) -> Optional[Callable]:
        """The entry of an all-gather into a tensor sending ``src``'s shape, or None while a
        plan may still come (the general path makes it) and for a dtype collectives do not
        take."""
        dtype, n, c = src.dtype, src.size, self.c
        if dtype.type not in SUPPORTED_DTYPES:
            return None
        plan_key, key = ("all_gather", dtype, n), (dtype, n)
        fp = Fingerprint("all_gather", 0, dtype.name, n, self.pg.group_id)
        self.make_room(self.all_gather)
        if c.plans.get(plan_key) is not None:
            entry = self._gather_planned(plan_key, key, fp)
        elif src.nbytes > c.small_bytes():
            entry = two_arrays(self._synced(lambda s, d, _, f: c.all_gather(s, d, f), None, fp),
                               dtype, n * self.pg.size)
        else:
            return None
        self.all_gather[key] = entry
        return entry

    def _gather_planned(self, plan_key: tuple, key: tuple,
                        fp: Fingerprint) -> Callable[[np.ndarray, np.ndarray], bool]:
        """The entry of a shape with a plan: its Python form as the general path runs it,
        handing over to the compiled entry (under ``key``) once the plan is compiled."""
        plans, pg, table = self.c.plans, self.pg, self.all_gather
        dtype, n = key
        count = n * pg.size

        def entry(src: np.ndarray, out: np.ndarray) -> bool:
            if not _usable(src, out, dtype, count):
                return False
            run = plans.get(plan_key)
            if run is None:  # the plans started afresh: the general path makes it again
                return False
            prepared = getattr(run, "prepared", None)
            if prepared is not None:
                compiled_entry = table[key] = self._gather_compiled(prepared, fp, dtype, n)
                return compiled_entry(src, out)
            seq = pg.next_seq()
            pg.run_now(run, "all_gather_into_tensor", seq, src.reshape(-1), out.reshape(-1),
                       fp._replace(seq=seq))
            return True
        return entry

    def _gather_compiled(self, prepared: Any, fp: Fingerprint, dtype: np.dtype,
                         n: int) -> Callable[[np.ndarray, np.ndarray], bool]:
        """The entry making the compiled all-gather's one call on the two arrays (the kernel
        moves their bytes). Numba has no float16 arrays, nor other byte orders: those are
        passed as bytes; the others as they are, which spares two views a call."""
        pg, watch = self.pg, self.c.t.watch
        count = n * pg.size
        as_bytes = dtype.type is np.float16 or not dtype.isnative
        samples = (np.zeros(n, dtype), np.zeros(count, dtype))
        if as_bytes:
            samples = (samples[0].view(np.uint8), samples[1].view(np.uint8))
        kernel, plan, address, finish = self._kernel(prepared, fp, samples)
        next_seq, queue = pg.next_seq, pg.queue
        acquire, release = queue.exec_lock.acquire, queue.exec_lock.release

        def entry(src: np.ndarray, out: np.ndarray) -> bool:
            if not _usable(src, out, dtype, count):
                return False
            sent = src if src.ndim == 1 else src.reshape(-1)
            got = out if out.ndim == 1 else out.reshape(-1)
            if as_bytes:
                sent, got = sent.view(np.uint8), got.view(np.uint8)
            seq = next_seq()
            queue.drain("all_gather_into_tensor", seq)  # CommQueue.run_sync, inlined
            acquire()
            try:
                status = kernel(sent, got, address, seq, watch.spin_polls)
                if status:  # as bytes: the GIL-releasing kernel it settles with has that form
                    finish(status, (sent.view(np.uint8), got.view(np.uint8)), seq)
            finally:
                release()
            return True
        entry.plan = plan  # the plan words live as long as the entry
        if not as_bytes:
            self._add_c_entry("all_gather_into_tensor", samples[0], count, kernel, address,
                              _as_bytes(finish), plan)
        return entry

    # ----- reduce-scatter --------------------------------------------------------------------
    def reduce_scatter_entry(self, src: np.ndarray, op: Any, op_code: str
                             ) -> Optional[Callable]:
        """The entry of a reduce-scatter of a tensor whose input has ``src``'s shape, with
        ``op``: the transport's own collective (``ShmCollectives.reduce_scatter``), as the
        general path ends in it (a small input: ``_summed``). None where the general path must
        raise or has nothing to send (a dtype or op collectives do not take, an input that
        does not split evenly over the group, an empty one)."""
        dtype, n, size = src.dtype, src.size, self.pg.size
        if dtype.type not in SUPPORTED_DTYPES or n == 0 or n % size or not reducible(dtype, op):
            return None
        self.make_room(self.reduce_scatter)
        fp = Fingerprint(f"reduce_scatter:{op_code}", 0, dtype.name, n, self.pg.group_id)
        run = self._synced(self.c.reduce_scatter, op, fp)
        key = (dtype, n, op)
        if src.nbytes <= self.c.summed_reduce_scatter_bytes():
            run = self._summed(run, key, fp)
        entry = self.reduce_scatter[key] = two_arrays(run, dtype, n // size)
        return entry

    def _summed(self, general: Callable, key: tuple, fp: Fingerprint) -> Callable[..., None]:
        """``run(src, out)`` of a reduce-scatter the transport runs as the all-reduce of a copy
        of its input (``ShmCollectives.reduce_scatter``): the general path's call while that
        all-reduce's plan is in Python, then the plan's compiled call with the reduce-scatter's
        fingerprint (``_compiled_copy``). The same generation, fingerprint and bits as the
        general path, without its checks, its copy per call and the plan's Python."""
        dtype, n, op = key
        plan_key, table, plans = ("all_reduce", dtype, n, op), self.reduce_scatter, self.c.plans
        if not dtype.isnative or dtype.type not in compiled.COMPILED_DTYPES:
            return general  # no compiled plan takes these (float16, other byte orders)

        def run(src: np.ndarray, out: np.ndarray) -> None:
            prepared = getattr(plans.get(plan_key), "prepared", None)
            if prepared is None or self.c.closed:  # the general path runs (and heats) the plan
                general(src, out)
                return
            go = self._compiled_copy(prepared, fp, dtype, n)
            # into the table this entry came from: a table cleared since keeps nothing of it
            table[key] = two_arrays(go, dtype, n // self.pg.size)
            go(src, out)
        return run

    def _compiled_copy(self, prepared: Any, fp: Fingerprint, dtype: np.dtype,
                       n: int) -> Callable[[np.ndarray, np.ndarray], None]:
        """``go(src, out)``: a reduce-scatter as the compiled all-reduce ``prepared`` of a copy
        of ``src`` this entry keeps, ``out`` receiving this rank's part. The copy is taken
        after queued async work finished and under the queue's lock, as the general path
        takes it (an async collective may still be writing ``src``)."""
        pg, watch = self.pg, self.c.t.watch
        whole = np.empty(n, dtype)
        m = n // pg.size
        part = whole[pg.rank * m:(pg.rank + 1) * m]
        kernel, plan, address, finish = self._kernel(prepared, fp, (whole,))
        next_seq, queue = pg.next_seq, pg.queue
        acquire, release = queue.exec_lock.acquire, queue.exec_lock.release

        def go(src: np.ndarray, out: np.ndarray) -> None:
            seq = next_seq()
            queue.drain("reduce_scatter", seq)
            acquire()
            try:
                whole[:] = src
                status = kernel(whole, address, seq, watch.spin_polls)
                if status:
                    finish(status, (whole,), seq)
                out[:] = part
            finally:
                release()
        go.plan = plan  # the plan words live as long as the entry
        return go


def _as_bytes(finish: Callable[[int, tuple, int], None]) -> Callable[[int, tuple, int], None]:
    """``finish`` given its arrays as bytes, as the all-gather's settling kernel takes them."""
    def settle(status: int, arrays: tuple, seq: int) -> None:
        finish(status, tuple(a.view(np.uint8) for a in arrays), seq)
    return settle


def _usable(src: np.ndarray, out: np.ndarray, dtype: np.dtype, count: int) -> bool:
    """Both arrays C-contiguous, aligned and writable (the compiled call takes the types of
    its samples, writable ones), of ``dtype``, ``out`` holding ``count`` elements."""
    return (src.flags.num & USABLE == USABLE and out.flags.num & USABLE == USABLE
            and src.dtype == dtype and out.dtype == dtype and out.size == count)
