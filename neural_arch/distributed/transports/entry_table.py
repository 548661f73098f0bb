"""The public calls' short path, run from C where the package's small extension was built
(``_entry_table.c``, compiled at install; a build without a C compiler skips it).

A compiled shared-memory entry (``shm.short_calls``) makes one Numba call, but the public call
around it was Python: ``dist.broadcast``'s checks and its dictionary lookup, then the entry's
flag tests, sequence number, queue drain and lock: in a two-rank loop of small broadcasts
on a 2-core machine, 1.1-2.1 us over ``MPI_Bcast``'s time, 0.3-0.6 us from C
(``docs/collectives.md``, *The public call in C*). A ``Table`` takes those steps in C: the
public call hands it the tensor and the op or root, and it runs the entry made for that
dtype object, element count and op or root (an array of any shape: its kernel gets a
one-dimensional view, as from the Python entry), or declines (False) and the Python path runs
as before; a barrier's table runs its one entry with no tensor (``run_alone``), an
all-gather's an entry on its input and output (``run_pair``).

``tables(...)`` makes the all-reduce's, broadcast's, barrier's and all-gather's tables of a
group where ``enabled()``: not where the extension is missing (or was built from other
sources: a warning) or ``NEURAL_ARCH_SHORT_C=0`` (read when the shm transport starts), so the
two paths can be set against each other; both run the same kernel on the same arguments with
the same sequence numbers.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Callable, Tuple

import numpy as np

API_VERSION = 5  # what this module expects of the extension (its own API_VERSION)
ENV_SWITCH = "NEURAL_ARCH_SHORT_C"

try:
    from . import _entry_table
except ImportError:  # not built: the Python entries serve every call
    Table = None
else:
    Table = _entry_table.Table
    if getattr(_entry_table, "API_VERSION", None) != API_VERSION:
        # an in-place build of older sources (``pip install -e`` is not rerun by a pull)
        warnings.warn(f"{_entry_table.__file__} was built from other sources (API_VERSION "
                      f"{getattr(_entry_table, 'API_VERSION', None)}, expected {API_VERSION}): "
                      f"not used; rebuild it with `pip install -e .`", RuntimeWarning)
        Table = None


def declined(*args: Any) -> bool:
    """What a table's ``run``, ``run_pair`` or ``run_alone`` answers where there is none:
    nothing run."""
    return False


def enabled() -> bool:
    """Whether the C tables are built and not switched off (``NEURAL_ARCH_SHORT_C`` ``0``,
    ``1``; another value is a ValueError naming it)."""
    value = os.environ.get(ENV_SWITCH, "1").strip() or "1"
    if value not in ("0", "1"):
        raise ValueError(f"{ENV_SWITCH}={value!r}: expected 0 (Python entries only) or 1 "
                         f"(C where built, the default)")
    return value == "1" and Table is not None


# a table each, and the arrays its kernels take
OPS = {"all_reduce": 1, "broadcast": 1, "barrier": 0, "all_gather_into_tensor": 2}


def tables(pg: Any, watch: Any) -> Tuple[Any, ...]:
    """The tables of the group ``pg``, one per ``OPS``, whose kernels poll with
    ``watch.spin_polls`` (where ``enabled()``)."""
    queue = pg.queue
    lock = queue.exec_lock
    return tuple(Table(np.ndarray, op, pg.next_seq, queue.drain, lock.acquire, lock.release,
                       watch, arrays) for op, arrays in OPS.items())


def finisher(finish: Callable[[int, tuple, int], None]) -> Callable[..., None]:
    """``finish(status, tensor, seq)`` as a table calls it (a barrier's: ``finish(status,
    seq)``; an all-gather's: ``finish(status, src, out, seq)``), for an entry's
    ``finish(status, args, seq)``."""
    def settle(status: int, *tensor_and_seq: Any) -> None:
        finish(status, tensor_and_seq[:-1], tensor_and_seq[-1])
    return settle
