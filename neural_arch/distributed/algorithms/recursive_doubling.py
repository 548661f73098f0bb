"""Recursive-doubling all-reduce: log2(n) rounds, the latency-optimal choice for small messages.

With a world size that is not a power of two, the first ``2 * extra`` ranks pair up: each even
rank hands its data to the odd rank above it, sits out the doubling rounds and gets the result
back at the end. In every combine the operand from the lower ranks goes first, so partners
compute the same bits and every rank ends with an identical result.

A piece is at most one segment (``exchange.segment_elems``), so each of its messages is the one
transport call that ``exchange``, ``send`` and ``recv`` would make for it: the piece calls the
transport directly, since on a vector of a few bytes cutting it into pieces costs more than
the transport's own call. A vector of one segment, the common case, is not sliced at all.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from ..reduce_ops import ReduceOp, combiner, divide_by_count
from ..transports.base import Fingerprint, Transport
from . import exchange

# What rank r of n does in a piece (``_schedule``): hands its data to the odd rank above and gets
# the result back, folds in the even rank below's first and sends it the result, or neither.
_HANDS_OVER, _FOLDS_IN, _DOUBLES = range(3)
# (n, r) -> (role, ((peer, peer's operand first), ...) per doubling round): a piece's loop reads
# its rounds instead of working them out on every call
_SCHEDULES: dict = {}


def _schedule(n: int, r: int) -> tuple[int, tuple[tuple[int, bool], ...]]:
    found = _SCHEDULES.get((n, r))
    if found is not None:
        return found
    pow2 = 1 << (n.bit_length() - 1)
    extra = n - pow2
    if r < 2 * extra and r % 2 == 0:
        found = (_HANDS_OVER, ())
    else:
        vrank = r // 2 if r < 2 * extra else r - extra
        rounds = []
        mask = 1
        while mask < pow2:
            vpeer = vrank ^ mask
            rounds.append((2 * vpeer + 1 if vpeer < extra else vpeer + extra, vpeer < vrank))
            mask <<= 1
        found = (_FOLDS_IN if r < 2 * extra else _DOUBLES, tuple(rounds))
    _SCHEDULES[(n, r)] = found
    return found


def _all_reduce_piece(t: Transport, buf: np.ndarray, other: Optional[np.ndarray],
                      combine: Callable[..., Any], fp: Fingerprint) -> None:
    """All-reduce ``buf`` (at most one segment) in place; ``other`` (as large; made here when
    None and a message needs it) receives."""
    r = t.rank
    role, rounds = _schedule(t.world_size, r)
    if role == _HANDS_OVER:
        t.send(buf, r + 1, fp)
        t.recv(buf, r + 1, fp)
        return
    if role == _FOLDS_IN:
        other = np.empty(buf.size, buf.dtype) if other is None else other
        t.recv(other, r - 1, fp)
        combine(other, buf, out=buf)
    for peer, theirs_first in rounds:
        if t.exchange_reduce(buf, peer, fp, combine, theirs_first):
            continue  # the transport's faster form, these bits: ``other`` is not needed
        other = np.empty(buf.size, buf.dtype) if other is None else other
        t.sendrecv(buf, peer, other, peer, fp)
        if theirs_first:
            combine(other, buf, out=buf)
        else:
            combine(buf, other, out=buf)
    if role == _FOLDS_IN:
        t.send(buf, r - 1, fp)


def all_reduce(t: Transport, buf: np.ndarray, op: ReduceOp, fp: Fingerprint) -> None:
    """In-place all-reduce; large buffers are processed one segment at a time."""
    if t.world_size == 1 or buf.size == 0:
        return
    _runner(buf.nbytes)(t, buf, combiner(op, buf.dtype), fp)


def plan(t: Transport, op: ReduceOp, dtype: np.dtype, nbytes: int, mean: int = 0
         ) -> Callable[[np.ndarray, Fingerprint], None]:
    """``all_reduce`` of every buffer of ``dtype`` and ``nbytes`` bytes on ``t``, then divided
    by ``mean`` unless 0 (AVERAGE's sum), what their calls share (the combine, whether it is
    one piece) taken once. Where the transport prepares every round of this rank itself
    (``Transport.exchange_reduce_plan``; a vector of one piece, a rank that only doubles), the
    plan runs those, the division in the last: they send the messages a round sends here and
    fold with its bits, so ranks on either form pair up."""
    if t.world_size == 1 or nbytes == 0:
        return lambda buf, fp: None
    run, combine = _runner(nbytes), combiner(op, dtype)
    role, rounds = _schedule(t.world_size, t.rank)
    if run is _one_piece and role == _DOUBLES:
        count, last = nbytes // np.dtype(dtype).itemsize, len(rounds) - 1
        steps = [t.exchange_reduce_plan(peer, dtype, count, combine, theirs_first,
                                        mean if i == last else 0)
                 for i, (peer, theirs_first) in enumerate(rounds)]
        if all(steps):
            return steps[0] if len(steps) == 1 else _in_turn(steps)
    if not mean:
        return lambda buf, fp: run(t, buf, combine, fp)

    def run_mean(buf: np.ndarray, fp: Fingerprint) -> None:
        run(t, buf, combine, fp)
        divide_by_count(buf, mean)
    return run_mean


def _in_turn(steps: list) -> Callable[[np.ndarray, Fingerprint], None]:
    def run(buf: np.ndarray, fp: Fingerprint) -> None:
        for step in steps:
            step(buf, fp)
    return run


def _runner(nbytes: int) -> Callable[..., None]:
    """How a buffer of ``nbytes`` is reduced: in one piece, or a segment at a time."""
    return _segments if nbytes > exchange.SEGMENT_BYTES else _one_piece


def _one_piece(t: Transport, buf: np.ndarray, combine: Callable[..., Any],
               fp: Fingerprint) -> None:
    _all_reduce_piece(t, buf, None, combine, fp)


def _segments(t: Transport, buf: np.ndarray, combine: Callable[..., Any],
              fp: Fingerprint) -> None:
    """A buffer of more than one segment, a segment at a time through one scratch."""
    seg = exchange.segment_elems(buf.itemsize)
    scratch = np.empty(seg, dtype=buf.dtype)
    for lo in range(0, buf.size, seg):
        piece = buf[lo:lo + seg]
        _all_reduce_piece(t, piece, scratch[:piece.size], combine, fp)
