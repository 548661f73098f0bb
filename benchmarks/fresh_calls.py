"""The fresh-data calls of ``bench_collectives.py``: inputs written before every call, and checks.

A benchmark that hands every call the same unchanged buffer flatters a single-copy transfer
(Open MPI's CMA): the peer reads lines that stay clean in its cache, which a training step's
freshly computed data (parameters broadcast or all-gathered, gradients reduce-scattered) never
are. ``rewriting`` turns a maker of ``collective_calls`` (``our_call``, ``native_call``) into one
whose calls write their inputs first, inside the timed call: a broadcast's root fills its whole
buffer with the call's index, the readers doing nothing more (``rewriting_root``); in an
all-gather or reduce-scatter every rank fills its whole input with ``fresh_value`` of the
call's index and its rank. ``check_rewritten`` checks what the calls left on every rank against
the inputs the ranks last wrote.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Sequence, Tuple

FRESH_COLLECTIVES = ("all_gather", "reduce_scatter", "broadcast")
FILL_INDEX_PERIOD = 1 << 24  # a rewriting root's call indices: 1 .. this, each exact in float32
EXACT_LIMIT = 1 << 24        # float32 holds every integer up to this exactly

Maker = Callable[[str, Dict[str, Any]], Callable[[], Any]]


def rewriting(make: Maker, rank: int, p: int) -> Maker:
    """``make`` for the fresh-data rows of every collective in FRESH_COLLECTIVES: a broadcast's
    as ``rewriting_root``'s, an all-gather's or reduce-scatter's with every rank filling its
    whole input (``send``) with ``fresh_value(index, rank, p)`` before every call, the index
    running 1 .. ``index_period(p)``."""
    period, root_rewriting = index_period(p), rewriting_root(make, rank)

    def make_rewriting(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
        if collective == "broadcast":
            return root_rewriting(collective, b)
        if collective not in FRESH_COLLECTIVES:
            raise ValueError(f"fresh-data calls are made for {FRESH_COLLECTIVES}, "
                             f"got {collective!r}")
        call, send, index = make(collective, b), b["send"], [0]

        def rewrite_then_call() -> Any:
            index[0] = index[0] % period + 1
            send.fill(fresh_value(index[0], rank, p))
            return call()
        return rewrite_then_call
    return make_rewriting


def index_period(p: int) -> int:
    """The call indices of rewritten all-gather and reduce-scatter inputs at ``p`` ranks run
    1 .. this, so that every ``fresh_value`` and the sum of the p ranks' is an integer of at
    most 2^24, exact in float32 in any order of summation: p * (period + 1) * p <= 2^24."""
    if p < 1 or EXACT_LIMIT // (p * p) < 3:  # at least 2: consecutive calls write anew
        raise ValueError(f"fresh-data inputs need 1 <= p <= {int((EXACT_LIMIT / 3) ** 0.5)} "
                         f"ranks, got p = {p}")
    return EXACT_LIMIT // (p * p) - 1


def fresh_value(index: int, rank: int, p: int) -> int:
    """Rank ``rank``'s input element at call ``index`` (from 1): index * p + rank, different
    for every rank and call of a period, and never 0 or negative (a spoiled output's -1)."""
    return index * p + rank


def rewriting_root(make: Maker, rank: int) -> Maker:
    """``make`` for a broadcast whose root (rank 0) fills its whole buffer with the call's index
    before every call, as a training step's freshly computed data would be, so that no reader
    still holds the buffer's lines in its cache; the readers' calls are ``make``'s own."""
    def make_rewriting(collective: str, b: Dict[str, Any]) -> Callable[[], Any]:
        call = make(collective, b)
        if rank != 0:
            return call
        buf, index = b["buf"], [0]

        def rewrite_then_call() -> Any:
            index[0] = index[0] % FILL_INDEX_PERIOD + 1  # float32 holds these exactly
            buf.fill(index[0])
            return call()
        return rewrite_then_call
    return make_rewriting


def check_rewritten(collective: str, b: Dict[str, Any], rank: int, p: int,
                    call: Optional[Callable[[], Any]] = None) -> None:
    """Every rank's output must follow from the inputs the ranks last wrote, as the timed calls
    left them, or after ``call`` when given (a call of ``rewriting``'s, the outputs spoiled
    first: a broadcast's readers' buffers, every rank's all-gather or reduce-scatter output, so
    that a copy that never reached them shows)."""
    from neural_arch import distributed as dist
    if collective == "broadcast":
        buf = b["buf"]
        if call is not None:
            if rank != 0:
                buf[...] = -1.0
            call()
        check_copies_of_root(dist.all_gather_object((float(buf.min()), float(buf.max()))),
                             buf.nbytes)
        return
    if call is not None:
        b["out"][...] = -1.0
        call()
    send = b["send"]
    check_fresh_result(collective, dist.all_gather_object((float(send.min()),
                                                           float(send.max()))),
                       b["out"], rank, p)


def check_copies_of_root(seen: Sequence[Tuple[float, float]], nbytes: int) -> None:
    """``seen[r]`` is rank r's (least, greatest) element: the root's must be one index it wrote
    (at least 1) and every reader's the same."""
    low, high = seen[0]
    if low != high or low < 1:
        raise RuntimeError(f"broadcast of {nbytes} B with a rewritten root: the root's buffer "
                           f"held {low} - {high}, expected one call index >= 1")
    wrong = [f"rank {r} held {lo} - {hi}" for r, (lo, hi) in enumerate(seen)
             if (lo, hi) != (low, high)]
    if wrong:
        raise RuntimeError(f"broadcast of {nbytes} B with a rewritten root: " + ", ".join(wrong)
                           + f", the root's {low}")


def check_fresh_result(collective: str, inputs: Sequence[Tuple[float, float]], out: Any,
                       rank: int, p: int) -> None:
    """``inputs[r]`` is rank r's (least, greatest) input element: each must be one
    ``fresh_value`` of a call index common to all ranks; rank ``rank``'s all-gather output must
    hold rank q's value in its block q, its reduce-scatter output the sum of the p values."""
    import numpy as np
    nbytes = out.nbytes * (1 if collective == "all_gather" else p)  # the size the tables name
    what = f"{collective} of {nbytes} B with every rank's input rewritten"
    indices = set()
    for r, (low, high) in enumerate(inputs):
        index, rest = divmod(low - r, p)
        if low != high or rest or index < 1:
            raise RuntimeError(f"{what}: rank {r}'s input held {low} - {high}, expected one "
                               f"value index * {p} + {r} with index >= 1")
        indices.add(int(index))
    if len(indices) != 1:
        raise RuntimeError(f"{what}: the ranks' inputs were written by calls {sorted(indices)}, "
                           f"expected one call index on all {p}")
    values = np.asarray([low for low, _ in inputs], np.float32)
    expected = np.repeat(values, out.size // p) if collective == "all_gather" \
        else np.full(out.shape, values.sum(dtype=np.float64), np.float32)
    wrong = np.flatnonzero(out != expected)
    if wrong.size:
        first = wrong[0]
        raise RuntimeError(f"{what}: rank {rank} of {p} held {out[first]} at element {first} "
                           f"({wrong.size} of {out.size} wrong), expected {expected[first]}")
