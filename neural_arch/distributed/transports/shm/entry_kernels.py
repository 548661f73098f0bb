"""The compiled prepared collectives as one call each: one array and a few integers.

Calling a Numba function costs about 0.1 us per argument it converts, and more for an array
(Numba wraps each in an object of its own): on a 4-byte all-reduce the twelve arguments of
``kernels.small_all_reduce`` cost more than its barrier. So a prepared collective keeps
everything that stays the same from call to call in a small int64 array of its own, its
*plan words* (the addresses of the control words, of the workspace and of the mean's factor,
the rank, the signature, ...), and these entry points take the caller's vector, the plan words'
address, the sequence number and the poll budget. They look the rest up, find this rank's next
generation in its own GEN word, and run the same steps as ``kernels`` (they call it). Passing
the addresses of arrays that live as long as the plan costs an integer each; the caller's
vector stays an array, since asking NumPy for its address costs more than Numba's conversion.

A status below zero means nothing was published and the caller calls again after a step in
Python: HEADER, the header area of the generation's half holds another collective's header
(the caller writes this one's with ``ShmCollectives.publish_header``, which also updates the
header signatures these kernels read); SETTLE, this rank left its last generation early (a
broadcast's root) and a peer has not reached it yet or called something else there
(``ShmCollectives.settle_early`` waits, or names the mismatch).
A ``polls`` of RESUME finishes a generation this rank has arrived at (after a WAIT).

Importing this module imports Numba.
"""
from __future__ import annotations

import numpy as np
from numba import carray, njit, types
from numba.extending import intrinsic

from .kernels import _generation, load_acquire, settled, small_all_gather, small_all_reduce, \
    small_broadcast
from .layout import GEN, LINE_WORDS

# The plan words: what a prepared collective keeps for its compiled calls.
WORDS, NWORDS, AREAS, ROWS, COLS, RANK, SIZE, SIG, HEADERS, PRODUCT, MEAN, FACTOR, ROOT = \
    range(13)
PLAN_WORDS = 16
HEADER = -1   # status: write this collective's header, then call again
SETTLE = -2   # status: settle the generation this rank left early, then call again
RESUME = -1   # polls: this rank has arrived; check the peers and finish


@intrinsic
def int64_pointer(typingctx, address):  # pragma: no cover - compiled
    """The int64 pointer at integer ``address``."""
    result = types.CPointer(types.int64)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(result))

    return result(address), codegen


@intrinsic
def pointer_like(typingctx, address, array):  # pragma: no cover - compiled
    """A pointer to ``array``'s element type at integer ``address``."""
    result = types.CPointer(array.dtype)

    def codegen(context, builder, signature, args):
        return builder.inttoptr(args[0], context.get_value_type(result))

    return result(address, array), codegen


@njit(cache=True)
def _plan(address):  # pragma: no cover - compiled
    return carray(int64_pointer(address), (PLAN_WORDS,))


@njit(cache=True)
def _begin(plan, polls):  # pragma: no cover - compiled
    """(control words, generation, status): the generation this call runs in, and HEADER if
    this collective's header must be written first (then nothing else was done)."""
    words = carray(int64_pointer(plan[WORDS]), (plan[NWORDS],))
    gen = load_acquire(words, plan[RANK] * LINE_WORDS + GEN)
    if polls == RESUME:
        return words, gen, 0
    gen += 1
    if not settled(words, plan[RANK], plan[SIZE], polls):
        return words, gen, SETTLE
    headers = carray(int64_pointer(plan[HEADERS]), (2,))
    return words, gen, HEADER if headers[gen & 1] != plan[SIG] else 0


@njit(cache=True)
def _prologue(plan_address, polls, like):  # pragma: no cover - compiled
    """The start of a collective with data: (plan words, control words, its (rows, cols) areas
    as ``like``'s element type, generation, ``_begin``'s status). The caller returns a nonzero
    status at once; the areas are only an address and a shape, so making them first costs
    nothing. LLVM inlines this into each entry point: the short path makes no extra call."""
    plan = _plan(plan_address)
    words, gen, status = _begin(plan, polls)
    areas = carray(pointer_like(plan[AREAS], like), (plan[ROWS], plan[COLS]))
    return plan, words, areas, gen, status


# These keep the GIL (see the ``_nogil`` forms at the end): the polls are bounded by the
# caller's budget and ``kernels.YIELDS`` yields, as a Python poll loop holding the GIL is.
@njit(cache=True)
def planned_barrier(plan_address, seq, polls):  # pragma: no cover - compiled
    """One generation with no data (``direct.barrier``'s steps)."""
    plan = _plan(plan_address)
    words, gen, status = _begin(plan, polls)
    if status:
        return status
    return _generation(words, plan[RANK], plan[SIZE], gen, plan[SIG], seq, polls,
                       polls == RESUME)


@njit(cache=True)
def planned_all_reduce(buf, plan_address, seq, polls):  # pragma: no cover - compiled
    """``kernels.small_all_reduce`` of ``buf`` (1-D, C-contiguous, writable)."""
    plan, words, areas, gen, status = _prologue(plan_address, polls, buf)
    if status:
        return status
    factor = carray(pointer_like(plan[FACTOR], buf), (1,))[0]
    return small_all_reduce(words, areas, plan[RANK], plan[PRODUCT] != 0, plan[MEAN], factor,
                            buf, gen, plan[SIG], seq, polls, polls == RESUME)


@njit(cache=True)
def planned_broadcast(buf, plan_address, seq, polls):  # pragma: no cover - compiled
    """``kernels.small_broadcast`` of ``buf``'s bytes (1-D, C-contiguous, writable)."""
    data = buf.view(np.uint8)
    plan, words, areas, gen, status = _prologue(plan_address, polls, data)
    if status:
        return status
    return small_broadcast(words, areas, plan[RANK], plan[ROOT], data, gen, plan[SIG], seq,
                           polls, polls == RESUME)


@njit(cache=True)
def planned_all_gather(src, dst, plan_address, seq, polls):  # pragma: no cover - compiled
    """``kernels.small_all_gather`` of ``src`` into ``dst`` (both 1-D, C-contiguous), as
    bytes."""
    pair = (src.view(np.uint8), dst.view(np.uint8))
    plan, words, areas, gen, status = _prologue(plan_address, polls, pair[0])
    if status:
        return status
    return small_all_gather(words, areas, plan[RANK], pair, gen, plan[SIG], seq, polls,
                            polls == RESUME)


# The same calls releasing the GIL, for the general path: there the async queue's thread runs
# them while the training thread computes, which must not stop for the polls. The public short
# path runs on the calling thread with the queue drained, and keeps the GIL: taking it back
# after another thread took it can cost a whole switch interval (5 ms).
@njit(cache=True, nogil=True)
def planned_all_reduce_nogil(buf, plan_address, seq, polls):  # pragma: no cover - compiled
    return planned_all_reduce(buf, plan_address, seq, polls)


@njit(cache=True, nogil=True)
def planned_broadcast_nogil(buf, plan_address, seq, polls):  # pragma: no cover - compiled
    return planned_broadcast(buf, plan_address, seq, polls)


@njit(cache=True, nogil=True)
def planned_all_gather_nogil(src, dst, plan_address, seq, polls):  # pragma: no cover - compiled
    return planned_all_gather(src, dst, plan_address, seq, polls)
