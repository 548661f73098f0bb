"""What the public calls' short path reads of a transport's short calls
(``collectives.tensors``): a table of entries per collective, keyed by what must match for an
entry to apply, and the array flags every entry tests before it runs.

Two kinds fill these tables: shared memory's own (``shm.short_calls``: a compiled call per
shape) and the general one for transports without their own (``group.short_calls``: the
algorithm the general path would run, without the layers above it). Both keep the tables here
and make entries their own way.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

from .entry_table import declined

MAX_ENTRIES = 1024  # entries per collective; past this they start afresh
# NumPy's flag bits (``ndarray.flags.num``) an entry's array must have: one attribute test
# instead of three (NPY_ARRAY_C_CONTIGUOUS, NPY_ARRAY_ALIGNED, NPY_ARRAY_WRITEABLE)
USABLE = 0x0001 | 0x0100 | 0x0400
READABLE = 0x0001 | 0x0100  # what an array only read from must be: USABLE less writable


def two_arrays(run: Callable[..., None], dtype: Any, out_count: int) -> Callable[..., bool]:
    """``entry(src, out)`` of a collective from one array into another (an all-gather or a
    reduce-scatter into a tensor): ``run(src, out)`` on both as vectors, or False, nothing run,
    for what the general path must stage, refuse or raise naming the shapes: ``src`` not
    C-contiguous and aligned, ``out`` not also writable or not ``out_count`` elements of
    ``dtype``."""
    def entry(src: Any, out: Any) -> bool:
        if (src.flags.num & READABLE != READABLE or out.flags.num & USABLE != USABLE
                or out.dtype != dtype or out.size != out_count):
            return False
        run(src if src.ndim == 1 else src.reshape(-1), out if out.ndim == 1
            else out.reshape(-1))
        return True
    return entry


class EntryTables:
    """The entries by collective: ``all_reduce`` by (dtype, count, op), ``broadcast`` by
    (dtype, count, root), ``all_gather`` by (dtype, count sent), ``reduce_scatter`` by (dtype,
    count of the input, op), and the one ``barrier``. The two kinds of short calls extend it
    with what the public calls ask of them: ``bind(pg)`` (whether the entries serve that
    group), and ``all_reduce_entry``, ``broadcast_entry``, ``reduce_scatter_entry`` and
    ``barrier_entry``, which make an entry on a miss; the general kind also
    ``all_gather_entry`` (shared memory's all-gathers run the plans of its collectives).
    ``all_reduce_now(tensor, op)``, ``broadcast_now(tensor, root)``, ``barrier_now()`` and
    ``all_gather_now(src, out)`` run a call from C (``entry_table``) where a kind keeps such
    tables, else decline."""

    def __init__(self) -> None:
        self.c_tables: Optional[tuple] = None
        self.clear()

    def clear(self) -> None:
        """Forget every entry (the group was destroyed, the transport closed)."""
        for table in self.c_tables or ():
            table.clear()
        self.c_tables = None
        self.all_reduce_now: Callable[[Any, Any], bool] = declined
        self.broadcast_now: Callable[[Any, Any], bool] = declined
        self.barrier_now: Callable[[], bool] = declined
        self.all_gather_now: Callable[[Any, Any], bool] = declined
        self.all_reduce: dict = {}
        self.broadcast: dict = {}
        self.all_gather: dict = {}
        self.reduce_scatter: dict = {}
        self.barrier: Optional[Callable[[], bool]] = None

    @staticmethod
    def make_room(table: dict) -> None:
        """Start ``table`` afresh once it holds MAX_ENTRIES (a program of ever new shapes)."""
        if len(table) >= MAX_ENTRIES:
            table.clear()
