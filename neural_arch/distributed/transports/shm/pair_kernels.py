"""The two-rank ``whole`` all-reduce rounds (``direct``) as one compiled loop (see ``pair_rounds``).

``whole_rounds`` takes, round after round, the steps ``direct._whole_rounds`` takes in Python,
on the same control words and workspace areas: copy the round into this rank's input area of
the generation's half, arrive at the generation, poll the peer's arrival, check the peer's
fingerprint (first round only, as the Python loop does), and reduce the round in place with the
peer's area as ``x0 op x1``, rank 0's operand first, a mean in the pass that adds. A rank in
this loop and a rank in the Python one therefore meet in the same generations and end with the
same bits.

It hands back to Python only what is rare, with the round it stopped at and the stage to take
it up again (``start``, ``stage``): WAKE, the peer sleeps on this rank's arrival counter (the
caller wakes it and resumes at POLL); WAIT, the peer did not arrive within the polls (the
caller waits with the timeout and the liveness checks, then resumes at CHECK); MISMATCH, the
peer runs another collective (nothing was reduced; the caller names both).

Why a round is not copied before the previous one is waited for: round k + 1 goes into the
half the peer read in round k - 1, and only the peer's arrival at round k's generation says
that it has finished reading it; two halves leave nothing to fill ahead.

Importing this module imports Numba.
"""
from __future__ import annotations

from numba import literally, njit

from .kernels import MISMATCH, WAIT, WAKE, cpu_relax, load_acquire, store_release
from .layout import GEN, LINE_WORDS, SEQ0, SIG0, SLEEP

# where ``whole_rounds`` takes up its ``start`` round
COPY, ARRIVE, POLL, CHECK = range(4)
# the reduction: ``SUM`` .. ``MAX`` as their ufuncs, ``MEAN`` is ``(x0 + x1) * factor``
SUM, PRODUCT, MIN, MAX, MEAN = range(5)

__all__ = ["ARRIVE", "CHECK", "COPY", "MAX", "MEAN", "MIN", "MISMATCH", "POLL", "PRODUCT",
           "SUM", "WAIT", "WAKE", "whole_rounds"]


@njit(cache=True, nogil=True)
def _reduce(acc, other, op, factor, acc_first):  # pragma: no cover - compiled
    """``acc = acc op other`` if ``acc_first`` (this rank is rank 0), else ``other op acc``.
    MIN and MAX follow NumPy: a NaN operand wins (the first, if both), and of two equal values
    the second (which tells -0.0 from 0.0).

    ``acc_first`` is a compile-time constant (``literally``): each order is compiled on its
    own, its choice of operands gone from the loops, which LLVM then vectorises. Taken at run
    time, the flag left the MIN loop unvectorised (6x as long at 256 KiB), and ``out = x0 op
    x1`` with ``out`` one of the two (aliased) left every loop unvectorised (3x)."""
    literally(acc_first)
    n = acc.size
    if op == SUM:
        for i in range(n):
            a, b = (acc[i], other[i]) if acc_first else (other[i], acc[i])
            acc[i] = a + b
    elif op == MEAN:
        for i in range(n):
            a, b = (acc[i], other[i]) if acc_first else (other[i], acc[i])
            acc[i] = (a + b) * factor
    elif op == PRODUCT:
        for i in range(n):
            a, b = (acc[i], other[i]) if acc_first else (other[i], acc[i])
            acc[i] = a * b
    elif op == MAX:
        for i in range(n):
            a, b = (acc[i], other[i]) if acc_first else (other[i], acc[i])
            acc[i] = a if (a != a or a > b) else b
    else:
        for i in range(n):
            a, b = (acc[i], other[i]) if acc_first else (other[i], acc[i])
            acc[i] = a if (a != a or a < b) else b


@njit(cache=True, nogil=True)
def whole_rounds(buf, areas, words, rank, gen, sig, seq, step, start, stage, polls, op,
                 factor):  # pragma: no cover - compiled
    """All-reduce ``buf`` (1-D, C-contiguous) with the one peer in rounds of ``step``
    elements, round k at generation ``gen + k``, from round ``start`` taken up at ``stage``;
    returns (status, round): (0, rounds) when done, else the status bit and the round to
    resume. ``areas`` are the workspace rows as ``buf``'s dtype (row ``half * 3 + r``: rank
    r's input area of that half), ``words`` the control words; ``sig`` and ``seq`` are what
    the caller published for ``gen`` and the peer must have published too."""
    n = buf.size
    rounds = (n + step - 1) // step
    line, peer = rank * LINE_WORDS, 1 - rank
    peer_line = peer * LINE_WORDS
    k = start
    while k < rounds:
        g = gen + k
        lo = k * step
        hi = min(lo + step, n)
        first = (g & 1) * 3
        part = buf[lo:hi]
        if stage <= COPY:  # a loop: Numba's slice assignment took 3x as long as memcpy
            own = areas[first + rank]
            for i in range(hi - lo):
                own[i] = part[i]
        if stage <= ARRIVE:
            store_release(words, line + GEN, g)  # orders the copy before it for the peer
            if load_acquire(words, peer_line + SLEEP) == line + GEN + 1:
                return WAKE, k
        if stage <= POLL:
            left = polls
            while load_acquire(words, peer_line + GEN) < g:
                left -= 1
                if left <= 0:
                    return WAIT, k
                cpu_relax()
        if k == 0:
            slot = peer_line + 2 * (g & 1)
            if load_acquire(words, slot + SIG0) != sig or load_acquire(words, slot + SEQ0) != seq:
                return (peer + 1) * MISMATCH, k
        other = areas[first + peer][:hi - lo]
        if rank == 0:  # constants: see _reduce
            _reduce(part, other, op, factor, True)
        else:
            _reduce(part, other, op, factor, False)
        stage = COPY
        k += 1
    return 0, rounds
