"""The agreement round in front of every operation, and ``join()`` for uneven data.

A collective needs every rank, so a rank that ran out of batches would leave the others
hanging in their next all-reduce. Here every Horovod operation (an ``allreduce``,
``allgather``, ``broadcast``, an object operation, a ``DistributedOptimizer`` step) first runs
one small int64 all-reduce, the *round*, which says what the operation is and how many ranks
still train. A rank inside ``join()`` does nothing but answer rounds: it sends "joined", reads
which operation the others are running, and runs the same collective with nothing to give
(zeros for a sum, no rows for a gather, a receiver for a broadcast), so nobody ever waits for
a collective that is not coming. When a round finds every rank joined, all leave together.

Layout of the round's vector (summed over the ranks):
  [0]                 active ranks (1 from each rank still training)
  [1 + 2i], [2 + 2i]  field i (kind, count, dtype, root, optimizer, names) and its square, from
                      active ranks only: a field's sum and sum of squares together prove that
                      every active rank sent the same value (sum^2 == active * sum of squares)
  then size slots     1 for a rank whose first join() round this is (``join`` returns the
                      highest such rank of the last round: the last rank that joined)
  then size slots     1 + a per-rank value (the rows of an allgather) from active ranks, so
                      each rank also learns which ranks are active
  then size slots     each active rank's kind, so a disagreement says who ran what

Named operations (``negotiation``) are matched by name in a round of their own kind, the
negotiation, which joined ranks answer too.

Average divides by the active ranks (those that contributed), not by the world size: with
ranks joined, the average is that of the gradients actually computed. (Horovod divides by the
full size, which shrinks the update by active/size.)
"""
from __future__ import annotations

import contextlib
import zlib
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np

from .. import distributed as dist
from . import basics

(ALLREDUCE, ALLGATHER, BROADCAST, STEP, BROADCAST_OBJECT, ALLGATHER_OBJECT,
 NEGOTIATE) = range(1, 8)
KIND_NAMES = {ALLREDUCE: "allreduce", ALLGATHER: "allgather", BROADCAST: "broadcast",
              STEP: "DistributedOptimizer step", BROADCAST_OBJECT: "broadcast_object",
              ALLGATHER_OBJECT: "allgather_object",
              NEGOTIATE: "negotiation of named operations"}
FIELDS = ("kind", "count", "dtype", "root", "optimizer", "names")
DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)  # what collectives carry
_HEAD = 1 + 2 * len(FIELDS)

# kind -> what a joined rank runs to match it: fn(round)
_MIRRORS: Dict[int, Callable[["Round"], None]] = {}
_joined = False  # this rank is inside join(): its own operations are a mistake


def register_mirror(kind: int, fn: Callable[["Round"], None]) -> None:
    _MIRRORS[kind] = fn


def dtype_code(dtype) -> int:
    dtype = np.dtype(dtype)
    for i, d in enumerate(DTYPES):
        if dtype == d:
            return i
    raise TypeError(f"Horovod operations carry {[np.dtype(d).name for d in DTYPES]}, got "
                    f"dtype {dtype}")


@dataclass
class Round:
    """What one agreement round found."""
    active: int                # ranks that contributed (still training)
    fields: Dict[str, int]     # the agreed operation (kind, count, dtype, root, optimizer)
    active_ranks: List[int]
    values: List[int]          # per-rank value (0 for joined ranks)
    joined_now: List[int]      # ranks for which this was their first round inside join()

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(DTYPES[self.fields["dtype"]])


def names_code(names: List[str]) -> int:
    """A 24-bit checksum of ``names`` in order (small enough for its square to fit the round)."""
    return zlib.crc32("\0".join(names).encode()) & 0xFFFFFF


def _vector(size: int) -> np.ndarray:
    return np.zeros(_HEAD + 3 * size, dtype=np.int64)


def _disagreement(name: str, total: int, active: int, kinds: np.ndarray) -> RuntimeError:
    if name == "names":
        return RuntimeError(
            "ranks name the parameters of a DistributedOptimizer differently: its gradients are "
            "matched by parameter name, so every rank must pass the same named_parameters "
            "(the same names for the same parameters)")
    who = ", ".join(f"rank {r} {KIND_NAMES.get(int(k), f'kind {int(k)}')}"
                    for r, k in enumerate(kinds) if k)
    return RuntimeError(
        f"ranks disagree on the {name} of a Horovod operation (sum {total} over {active} "
        f"ranks; {who}): every rank must call the same unnamed operations in the same order "
        f"with the same shapes and dtypes, and wait for named ones at the same points")


def _decode(vec: np.ndarray, size: int) -> Round:
    active = int(vec[0])
    flags, values = vec[_HEAD:_HEAD + size], vec[_HEAD + size:_HEAD + 2 * size]
    fields = {}
    for i, name in enumerate(FIELDS):
        total, squares = int(vec[1 + 2 * i]), int(vec[2 + 2 * i])
        if active and total * total != active * squares:
            raise _disagreement(name, total, active, vec[_HEAD + 2 * size:])
        fields[name] = total // active if active else 0
    return Round(active, fields, [r for r in range(size) if values[r] > 0],
                 [max(int(v) - 1, 0) for v in values], [r for r in range(size) if flags[r]])


class PendingRound:
    """A round issued asynchronously (the optimizer starts it during backward)."""

    def __init__(self, vec: np.ndarray, work, size: int) -> None:
        self._vec, self._work, self._size = vec, work, size
        self._round: Optional[Round] = None

    def result(self) -> Round:
        if self._round is None:
            self._work.wait()
            self._round = _decode(self._vec, self._size)
        return self._round

    def is_completed(self) -> bool:
        return self._work.is_completed()


def start_round(kind: int, count: int = 0, dtype: int = 0, root: int = 0, optimizer: int = 0,
                names: int = 0, value: int = 0) -> PendingRound:
    """Announce an operation of this (training) rank; the round runs in the background."""
    if _joined:
        raise RuntimeError(f"hvd.{KIND_NAMES[kind]} on a rank inside hvd.join(): a joined rank "
                           "only answers the other ranks' operations")
    size = basics.size()
    vec = _vector(size)
    vec[0] = 1
    for i, v in enumerate((kind, count, dtype, root, optimizer, names)):
        vec[1 + 2 * i], vec[2 + 2 * i] = v, v * v
    vec[_HEAD + size + basics.rank()] = 1 + value
    vec[_HEAD + 2 * size + basics.rank()] = kind
    return PendingRound(vec, dist.all_reduce(vec, async_op=True), size)


def agree(kind: int, **fields: int) -> Round:
    """``start_round`` and wait for it."""
    return start_round(kind, **fields).result()


def check_root_active(rnd: Round, root: int, what: str) -> None:
    """A broadcast from a joined rank cannot happen: every rank raises, nobody waits."""
    if root not in rnd.active_ranks:
        raise RuntimeError(f"hvd.{what} from root_rank {root}, which has already called "
                           f"hvd.join(): the root of a broadcast must still be training")


@contextlib.contextmanager
def contributing():
    """A joined rank running an operation of its own: a named one it submitted before
    ``join()``, whose name the training ranks have now reached."""
    global _joined
    previous, _joined = _joined, False
    try:
        yield
    finally:
        _joined = previous


def answer_round(first: bool = False) -> Round:
    """As a joined rank: take part in the training ranks' next round and run the collective
    they announce with nothing to give. ``first``: this rank's first round inside join()."""
    size, me = basics.size(), basics.rank()
    vec = _vector(size)
    vec[_HEAD + me] = 1 if first else 0
    dist.all_reduce(vec)
    rnd = _decode(vec, size)
    if rnd.active:
        kind = rnd.fields["kind"]
        if kind not in _MIRRORS:
            raise RuntimeError(f"hvd.join(): the training ranks run an operation of unknown "
                               f"kind {kind}")
        _MIRRORS[kind](rnd)
    return rnd


def join(device: int = -1) -> int:
    """Wait for every rank, answering the operations of those still training with empty
    contributions; returns the last rank that joined (the highest, when several joined in the
    same round). Only Horovod operations are answered: a plain ``neural_arch.distributed``
    collective on a training rank while another has joined would wait for it. Named operations
    this rank submitted and has not waited for still run, with its data, once the training
    ranks submit their names."""
    global _joined
    # they register what joined ranks mirror
    from . import negotiation, ops, optimizer, state  # noqa: F401
    basics._layout()
    first = True
    _joined = True
    try:
        while True:
            rnd = answer_round(first)
            first = False
            if rnd.active == 0:
                return max(rnd.joined_now) if rnd.joined_now else basics.rank()
    finally:
        _joined = False
