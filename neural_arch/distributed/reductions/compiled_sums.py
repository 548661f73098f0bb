"""The Numba forms of ``kernels``: float16 sums in float32, and the two-rank mean.

NumPy has no vector loop for float16: every element of ``np.add`` on float16 is converted to
float32, added and rounded back one at a time, about twenty times as slow as the float32 add.
LLVM knows the half type, and on x86-64 with F16C (every such core since 2012) or on ARMv8 it
converts eight or sixteen elements per instruction. Numba has no float16 of its own, so the
kernels below take float16 arrays as their uint16 bits and convert them through two LLVM
intrinsics, ``widen`` (exact) and ``narrow`` (round to nearest even, overflow to infinity: the
IEEE conversion, the one NumPy's casts make).

Where an output may be one of the inputs, a loop writes either an array it alone reads from
(``acc[i] = f(acc[i], other[i])``) or a scratch block: a loop whose output is the same memory
as one of two inputs fails LLVM's overlap check and runs one element at a time.

Importing this module imports Numba; ``kernels`` imports it on first use.
"""
from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

BLOCK = 4096  # elements of float32 scratch per block: the block and its inputs stay in L1


@intrinsic
def widen(typingctx, bits):  # pragma: no cover - compiled
    """float16 bits (uint16) -> their float32 value, exactly."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())

    return types.float32(types.uint16), codegen


@intrinsic
def narrow(typingctx, value):  # pragma: no cover - compiled
    """float32 -> the bits (uint16) of the nearest float16, ties to even."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))

    return types.uint16(types.float32), codegen


MULTIPLY, DIVIDE = 1, 2  # how a float16 sum becomes a mean: times 1/p, or divided by p


@njit(cache=True, nogil=True)
def half_sum(out, operands, mean, factor):  # pragma: no cover - compiled
    """``out = round16((operands[0] + operands[1] + ...) * or / factor)``: the operands'
    float32 values summed left to right in float32, multiplied by ``factor`` (``mean`` ==
    MULTIPLY) or divided by it (DIVIDE) or neither (0), rounded once. All are uint16 views of
    float16 vectors of one length; ``out`` may be one of the operands."""
    n, count = out.size, len(operands)
    acc = np.empty(min(BLOCK, n), np.float32)
    for start in range(0, n, BLOCK):
        width = min(BLOCK, n - start)
        first = operands[0][start:start + width]
        if count == 1:
            for i in range(width):
                acc[i] = widen(first[i])
        else:
            second = operands[1][start:start + width]
            for i in range(width):
                acc[i] = widen(first[i]) + widen(second[i])
        for j in range(2, count):
            other = operands[j][start:start + width]
            for i in range(width):
                acc[i] = acc[i] + widen(other[i])
        target = out[start:start + width]
        if mean == MULTIPLY:
            for i in range(width):
                target[i] = narrow(acc[i] * factor)
        elif mean == DIVIDE:
            for i in range(width):
                target[i] = narrow(acc[i] / factor)
        else:
            for i in range(width):
                target[i] = narrow(acc[i])


@njit(cache=True, nogil=True)
def half_pair(acc, other, mean, factor, acc_first):  # pragma: no cover - compiled
    """``half_sum(acc, (acc, other), mean, factor)`` (``(other, acc)`` unless ``acc_first``) in
    one loop: a loop that writes only an array it reads at the same index vectorizes."""
    if acc_first:
        if mean == MULTIPLY:
            for i in range(acc.size):
                acc[i] = narrow((widen(acc[i]) + widen(other[i])) * factor)
        elif mean == DIVIDE:
            for i in range(acc.size):
                acc[i] = narrow((widen(acc[i]) + widen(other[i])) / factor)
        else:
            for i in range(acc.size):
                acc[i] = narrow(widen(acc[i]) + widen(other[i]))
    elif mean == MULTIPLY:
        for i in range(acc.size):
            acc[i] = narrow((widen(other[i]) + widen(acc[i])) * factor)
    elif mean == DIVIDE:
        for i in range(acc.size):
            acc[i] = narrow((widen(other[i]) + widen(acc[i])) / factor)
    else:
        for i in range(acc.size):
            acc[i] = narrow(widen(other[i]) + widen(acc[i]))


@njit(cache=True, nogil=True)
def half_pair_mean(acc, other, factor, acc_first):  # pragma: no cover - compiled
    """``acc = round16(round16(acc + other) * factor)`` on float16 bits, in place (``other +
    acc`` unless ``acc_first``): the float16 sum rounded, then scaled and rounded again, as a
    ring rounds a partial sum and then takes the mean of the finished piece, in one pass."""
    if acc_first:
        for i in range(acc.size):
            acc[i] = narrow(widen(narrow(widen(acc[i]) + widen(other[i]))) * factor)
    else:
        for i in range(acc.size):
            acc[i] = narrow(widen(narrow(widen(other[i]) + widen(acc[i]))) * factor)


@njit(cache=True, nogil=True)
def pair_mean(acc, other, factor, acc_first):  # pragma: no cover - compiled
    """``acc = (acc + other) * factor`` in their dtype (float32 or float64), in place; the
    operands in that order, or ``other + acc`` unless ``acc_first`` (a NaN keeps the payload
    of the first operand, so both ranks of a pair must add in the same order)."""
    if acc_first:
        for i in range(acc.size):
            acc[i] = (acc[i] + other[i]) * factor
    else:
        for i in range(acc.size):
            acc[i] = (other[i] + acc[i]) * factor


@njit(cache=True, nogil=True)
def to_half(src, out):  # pragma: no cover - compiled
    """float32 -> float16 bits (uint16), ties to even."""
    for i in range(src.size):
        out[i] = narrow(src[i])


@njit(cache=True, nogil=True)
def to_single(src, out):  # pragma: no cover - compiled
    """float16 bits (uint16) -> float32, exactly."""
    for i in range(src.size):
        out[i] = widen(src[i])
