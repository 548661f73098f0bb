"""The prepared small shared-memory collectives as compiled functions (see ``compiled``).

Each takes the steps of its Python form in ``plans`` on the same control words and
workspace areas: write this rank's data into its input area of the generation's half, publish
the fingerprint's signature and sequence number, arrive, poll every peer's arrival, check the
peers' signatures, then reduce or copy out of the input areas. A broadcast's root stops after
arriving (``generation``: it leaves the generation early), and every collective first checks
(``settled``) that the generation this rank left early, if any, is done on every peer.

Peers read and write the control words while this code runs, so every access to them is an
atomic 8-byte load (acquire) or store (release), built from LLVM through Numba. Plain array
reads could be hoisted out of a polling loop by the compiler, and the release store of the
arrival counter is what orders the copied vector before it for the peers (on x86-64 both are
ordinary moves). The polling loop runs ``pause`` on x86-64, which leaves the core's other
hardware thread its share while this one waits; once the caller's budget of polls is spent it
gives the core away (``sched_yield``) before each of YIELDS more looks, so that where ranks
outnumber cores the late peer can run now rather than after this rank's Python wait begins
(four ranks on two cores: a 4-byte all-reduce in 14-30 us instead of 53-79, a barrier in
5.5-6.6 instead of 18-19, ``docs/collectives.md``).

Importing this module imports Numba.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from .byte_copies import copy_range
from .layout import EARLY, GEN, LINE_WORDS, SEQ0, SIG0, SLEEP

# Bits of the status word small_all_reduce returns; 0 is done.
WAKE = 1      # a peer sleeps on this rank's arrival counter: wake it
WAIT = 2      # a peer had not arrived within the polls: wait, then call again to finish
MISMATCH = 4  # status // MISMATCH - 1 is a peer whose fingerprint differs (nothing reduced)

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")
YIELDS = 32


def _word_pointer(context, builder, signature, args):
    array_type = signature.args[0]
    array = context.make_array(array_type)(context, builder, args[0])
    return cgutils.get_item_pointer(context, builder, array_type, array, [args[1]],
                                    wraparound=False)


@intrinsic
def load_acquire(typingctx, words, index):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        return builder.load_atomic(_word_pointer(context, builder, signature, args), "acquire", 8)

    return types.int64(words, types.intp), codegen


@intrinsic
def store_release(typingctx, words, index, value):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        builder.store_atomic(args[2], _word_pointer(context, builder, signature, args),
                             "release", 8)
        return context.get_dummy_value()

    return types.void(words, types.intp, types.int64), codegen


@intrinsic
def cpu_relax(typingctx):  # pragma: no cover - compiled
    def codegen(context, builder, signature, args):
        if _X86:
            pause = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(ir.VoidType(), []), "llvm.x86.sse2.pause")
            builder.call(pause, [])
        return context.get_dummy_value()

    return types.void(), codegen


@intrinsic
def yield_core(typingctx):  # pragma: no cover - compiled
    """``sched_yield()``, by name: the C library's symbol, resolved when the code is loaded
    (a cached kernel keeps no address of this process)."""
    def codegen(context, builder, signature, args):
        call = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.IntType(32), []), "sched_yield")
        builder.call(call, [])
        return context.get_dummy_value()

    return types.void(), codegen


@njit(cache=True, nogil=True)
def _arrive(words, rank, p, gen, sig, seq):  # pragma: no cover - compiled
    """Publish the signature and sequence number, arrive at ``gen``, and return WAKE if a
    peer sleeps on this rank's counter (else 0)."""
    half = gen & 1
    line = rank * LINE_WORDS
    store_release(words, line + SIG0 + 2 * half, sig)
    store_release(words, line + SEQ0 + 2 * half, seq)
    store_release(words, line + GEN, gen)
    status = 0
    for q in range(p):
        if q != rank and load_acquire(words, q * LINE_WORDS + SLEEP) == line + GEN + 1:
            status = WAKE
    return status


@njit(cache=True, nogil=True)
def _peers_reached(words, rank, p, gen, polls):  # pragma: no cover - compiled
    """Whether every peer has arrived at ``gen``, each polled at most ``polls`` times, then
    at most YIELDS times more, each after giving the core away."""
    for q in range(p):
        if q != rank:
            left, yields = polls, YIELDS
            while load_acquire(words, q * LINE_WORDS + GEN) < gen:
                left -= 1
                if left > 0:
                    cpu_relax()
                elif yields > 0:
                    yields -= 1
                    yield_core()
                else:
                    return False
    return True


@njit(cache=True, nogil=True)
def _meet(words, rank, p, gen, sig, seq, polls):  # pragma: no cover - compiled
    """``_arrive``, then poll every peer's arrival (WAIT if one is late)."""
    status = _arrive(words, rank, p, gen, sig, seq)
    if not _peers_reached(words, rank, p, gen, polls):
        return status | WAIT
    return status


@njit(cache=True, nogil=True)
def _mismatch(words, rank, p, gen, sig, seq):  # pragma: no cover - compiled
    """0, or MISMATCH times (1 + the first peer that published another signature or seq)."""
    half = gen & 1
    for q in range(p):
        if q != rank:
            line = q * LINE_WORDS + 2 * half
            if (load_acquire(words, line + SIG0) != sig
                    or load_acquire(words, line + SEQ0) != seq):
                return (q + 1) * MISMATCH
    return 0


@njit(cache=True, nogil=True)
def settled(words, rank, p, polls):  # pragma: no cover - compiled
    """Whether this rank may write for a new generation: it left none early (see
    ``generation``), or every peer has since reached that one (polled like ``_meet``) with the
    same fingerprint, and then the EARLY word is cleared. False (the caller hands over to
    ``Generation.settle``) when a peer is late past the polls or differs."""
    line = rank * LINE_WORDS
    early = load_acquire(words, line + EARLY)
    if early == 0:
        return True
    if not _peers_reached(words, rank, p, early, polls):
        return False
    half = early & 1
    if _mismatch(words, rank, p, early, load_acquire(words, line + SIG0 + 2 * half),
                 load_acquire(words, line + SEQ0 + 2 * half)):
        return False
    store_release(words, line + EARLY, 0)
    return True


@njit(cache=True, nogil=True)
def _generation(words, rank, p, gen, sig, seq, polls, resume):  # pragma: no cover - compiled
    """``_meet`` (unless resuming), then ``_mismatch`` once every peer has arrived: a status
    with no bit but WAKE set means the collective may read the peers' areas."""
    status = 0 if resume else _meet(words, rank, p, gen, sig, seq, polls)
    if status & WAIT:
        return status
    return status | _mismatch(words, rank, p, gen, sig, seq)


@njit(cache=True, nogil=True)
def _publish_and_meet(src, words, areas, rank, gen, sig, seq, polls,
                      resume):  # pragma: no cover - compiled
    """Copy ``src`` into this rank's input area of ``gen``'s half (unless resuming), then run
    the generation (see ``_generation``)."""
    p = areas.shape[0] // 2 - 1
    if not resume:
        own = areas[(gen & 1) * (p + 1) + rank]
        for i in range(src.size):
            own[i] = src[i]
    return _generation(words, rank, p, gen, sig, seq, polls, resume)


# Each collective below is one generation and returns a status (the constants above). What
# stays the same from call to call comes first (the caller binds it once): ``words``, the int64
# control words; ``areas``, the workspace as rows of its areas, row ``half * (p + 1) + r``
# being rank r's input area of that half; the rank and the op or root. With ``resume`` this
# rank has published and every peer has arrived: only the checks and the copies out are left.

MULTIPLY, DIVIDE = 1, 2  # how small_all_reduce takes a mean: by a reciprocal, or dividing


@njit(cache=True, nogil=True)
def small_all_reduce(words, areas, rank, product, mean, factor, buf, gen, sig, seq, polls,
                     resume):  # pragma: no cover - compiled
    """Everyone publishes ``buf``, then reduces all of them in rank order into it:
    ``product`` multiplies instead of adding; ``mean`` (MULTIPLY or DIVIDE, else 0) scales the
    sum by ``factor``, a scalar of ``buf``'s dtype, in the loop that adds the last operand."""
    status = _publish_and_meet(buf, words, areas, rank, gen, sig, seq, polls, resume)
    if status & ~WAKE:
        return status
    p = areas.shape[0] // 2 - 1
    first, n = (gen & 1) * (p + 1), buf.size
    a, b = areas[first], areas[first + 1]
    if product:
        for i in range(n):
            buf[i] = a[i] * b[i]
        for r in range(2, p):
            c = areas[first + r]
            for i in range(n):
                buf[i] = buf[i] * c[i]
    elif p == 2:
        _add_and_scale(buf, a, b, mean, factor)
    else:
        for i in range(n):
            buf[i] = a[i] + b[i]
        for r in range(2, p - 1):
            c = areas[first + r]
            for i in range(n):
                buf[i] = buf[i] + c[i]
        _add_and_scale_in_place(buf, areas[first + p - 1], mean, factor)
    return status


# Two forms, so that LLVM sees which arrays may be the same memory and vectorizes both.
@njit(cache=True, nogil=True)
def _add_and_scale(out, x, y, mean, factor):  # pragma: no cover - compiled
    """``out = x + y``, times or divided by ``factor`` (see ``small_all_reduce``)."""
    if mean == MULTIPLY:
        for i in range(out.size):
            out[i] = (x[i] + y[i]) * factor
    elif mean == DIVIDE:
        for i in range(out.size):
            out[i] = (x[i] + y[i]) / factor
    else:
        for i in range(out.size):
            out[i] = x[i] + y[i]


@njit(cache=True, nogil=True)
def _add_and_scale_in_place(acc, y, mean, factor):  # pragma: no cover - compiled
    """``acc = acc + y``, times or divided by ``factor``."""
    if mean == MULTIPLY:
        for i in range(acc.size):
            acc[i] = (acc[i] + y[i]) * factor
    elif mean == DIVIDE:
        for i in range(acc.size):
            acc[i] = (acc[i] + y[i]) / factor
    else:
        for i in range(acc.size):
            acc[i] = acc[i] + y[i]


@njit(cache=True, nogil=True)
def small_broadcast(words, areas, rank, root, data, gen, sig, seq, polls,
                    resume):  # pragma: no cover - compiled
    """The root publishes ``data`` (bytes) in the half's first input area and returns at once,
    leaving the generation early (``generation``: its next collective first checks that every
    reader got there); the others wait for every rank, check the fingerprints and copy it.
    Both copies are one ``memcpy`` past a few bytes (``byte_copies``)."""
    p = areas.shape[0] // 2 - 1
    area = areas[(gen & 1) * (p + 1)]
    n = data.size
    if rank == root:
        copy_range(area, data, 0, n)
        store_release(words, rank * LINE_WORDS + EARLY, gen)
        return _arrive(words, rank, p, gen, sig, seq)
    status = _generation(words, rank, p, gen, sig, seq, polls, resume)
    if status & ~WAKE:
        return status
    copy_range(data, area, 0, n)
    return status


@njit(cache=True, nogil=True)
def small_all_gather(words, areas, rank, pair, gen, sig, seq, polls,
                     resume):  # pragma: no cover - compiled
    """Everyone publishes ``src`` (bytes) in its input area; all copy every area, in rank
    order, into ``dst`` (``pair`` is ``(src, dst)``). ``src`` may be this rank's block of
    ``dst``: it is read first."""
    src, dst = pair
    status = _publish_and_meet(src, words, areas, rank, gen, sig, seq, polls, resume)
    if status & ~WAKE:
        return status
    p = areas.shape[0] // 2 - 1
    first, n = (gen & 1) * (p + 1), src.size
    for r in range(p):
        area = areas[first + r]
        for i in range(n):
            dst[r * n + i] = area[i]
    return status

