"""The small shared-memory all-reduce as one compiled function (see ``shm_compiled``).

``small_all_reduce`` takes the steps of ``shm_prepared.all_reduce`` on the same control words
and workspace areas: copy this rank's vector into its input area of the generation's half,
publish the fingerprint's signature and sequence number, arrive, poll every peer's arrival,
check the peers' signatures, and reduce all input areas in rank order into the caller's vector.

Peers read and write the control words while this code runs, so every access to them is an
atomic 8-byte load (acquire) or store (release), built from LLVM through Numba. Plain array
reads could be hoisted out of a polling loop by the compiler, and the release store of the
arrival counter is what orders the copied vector before it for the peers (on x86-64 both are
ordinary moves). The polling loop runs ``pause`` on x86-64, which leaves the core's other
hardware thread its share while this one waits.

Importing this module imports Numba.
"""
from __future__ import annotations

import platform

from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

from ..transports.shm_sync import GEN, LINE_WORDS, SEQ0, SIG0, SLEEP

# Bits of the status word small_all_reduce returns; 0 is done.
WAKE = 1      # a peer sleeps on this rank's arrival counter: wake it
WAIT = 2      # a peer had not arrived within the polls: wait, then call again to finish
MISMATCH = 4  # status // MISMATCH - 1 is a peer whose fingerprint differs (nothing reduced)

_X86 = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686")


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


@njit(cache=True, nogil=True)
def small_all_reduce(buf, words, areas, rank, gen, sig, seq, polls, product, divisor,
                     resume):  # pragma: no cover - compiled
    """One generation of the one-barrier all-reduce; returns a status (module constants).

    ``words``: the int64 control words. ``areas``: the workspace as rows of its areas, row
    ``half * (p + 1) + r`` being rank r's input area of that half. ``divisor`` > 0 divides the
    sum (AVERAGE); ``product`` multiplies instead of adding. With ``resume`` the vector was
    published and every peer has arrived: only the checks and the reduction are left.
    """
    p = areas.shape[0] // 2 - 1
    half = gen & 1
    first = half * (p + 1)
    n = buf.size
    status = 0
    if not resume:
        own = areas[first + rank]
        for i in range(n):
            own[i] = buf[i]
        line = rank * LINE_WORDS
        store_release(words, line + SIG0 + 2 * half, sig)
        store_release(words, line + SEQ0 + 2 * half, seq)
        store_release(words, line + GEN, gen)
        for q in range(p):
            if q != rank and load_acquire(words, q * LINE_WORDS + SLEEP) == line + GEN + 1:
                status = WAKE
        for q in range(p):
            if q != rank:
                left = polls
                while load_acquire(words, q * LINE_WORDS + GEN) < gen:
                    left -= 1
                    if left <= 0:
                        return status | WAIT
                    cpu_relax()
    for q in range(p):
        if q != rank:
            line = q * LINE_WORDS + 2 * half
            if (load_acquire(words, line + SIG0) != sig
                    or load_acquire(words, line + SEQ0) != seq):
                return status | (q + 1) * MISMATCH
    a, b = areas[first], areas[first + 1]
    if product:
        for i in range(n):
            buf[i] = a[i] * b[i]
        for r in range(2, p):
            c = areas[first + r]
            for i in range(n):
                buf[i] = buf[i] * c[i]
    else:
        for i in range(n):
            buf[i] = a[i] + b[i]
        for r in range(2, p):
            c = areas[first + r]
            for i in range(n):
                buf[i] = buf[i] + c[i]
    if divisor > 0:
        for i in range(n):
            buf[i] = buf[i] / divisor
    return status
