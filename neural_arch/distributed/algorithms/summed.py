"""Small broadcasts, all-gathers and reduce-scatters as one recursive-doubling all-reduce.

On a few bytes a collective costs its rounds of messages, not its bytes. The ring all-gather
and reduce-scatter take p - 1 rounds; a broadcast on the binomial tree takes ceil(log2 p)
rounds to agree on the root (``agreement``) and as many again down the tree. Recursive
doubling's all-reduce takes log2 p rounds (two more where p is not a power of two), and a
transport that prepares its rounds once per shape (``Transport.exchange_reduce_plan``) runs
them without the layers above. So below a measured size (``MAX_BYTES``) these collectives
run as one all-reduce of a vector that carries what they move:

- all-gather: every rank's input in its own slot of a zeroed vector of int64 words, summed.
  Every word has at most one non-zero addend, so the sum is that rank's bits whatever they
  mean (a float's negative zero or NaN payload included, which a float sum would change).
- broadcast: the root's bytes (the other ranks' words zero) followed by one word per rank,
  rank r's root + 1 in word r. After the sum every rank holds every rank's root, the array
  ``agree_on_root`` builds, and ranks that passed different roots all raise the same
  CollectiveMismatchError before their buffers are written.
- reduce-scatter: the all-reduce of a copy of the input with the collective's own op (AVERAGE
  as SUM, this rank's part divided after), of which this rank keeps its part.

Every rank of a call takes the same form: the choice depends only on the sizes, the world size
and the collective, which every rank's fingerprint already holds.
"""
from __future__ import annotations

from typing import Callable, Optional

import numpy as np

from ..reduce_ops import ReduceOp, divide_by_count
from ..transports.base import Fingerprint, Transport, check_roots, split_root
from . import recursive_doubling

# Up to these many bytes (a broadcast's buffer, an all-gather's output, a reduce-scatter's
# input) the summed form runs. Measured at p = 4 on 16 cores (benchmarks/RESULTS.md, "Small
# collectives as one all-reduce"): at 32 KiB the summed broadcast and all-gather took less time
# on tcp and mpi than the tree and the ring at 16 KiB; at 64 KiB the ring's all-gather tied or
# won, and on tcp the tree's broadcast won. The summed reduce-scatter (all of its input moving
# every round) at 32 KiB only tied the ring's at 16 KiB on mpi.
MAX_BYTES = {"broadcast": 32 << 10, "all_gather": 32 << 10, "reduce_scatter": 16 << 10}
_WORD = np.dtype(np.int64)


def _words(nbytes: int) -> int:
    return -(-nbytes // _WORD.itemsize)


def takes(collective: str, t: Transport, nbytes: int) -> bool:
    """Whether ``collective`` of a vector of ``nbytes`` (see ``MAX_BYTES``) runs summed on
    ``t``; never one ``MAX_BYTES`` does not name. Two ranks keep their one exchange
    (``pair_broadcast``, the ring's one step)."""
    return t.world_size > 2 and nbytes <= MAX_BYTES.get(collective, -1)


def _sum_words(t: Transport) -> Callable[[np.ndarray, Fingerprint], None]:
    """The sum of a word vector, call by call (the general path's per-call choice)."""
    return lambda words, fp: recursive_doubling.all_reduce(t, words, ReduceOp.SUM, fp)


def _planned_words(t: Transport, count: int) -> Callable[[np.ndarray, Fingerprint], None]:
    """The sum of every vector of ``count`` words, planned once (a short entry's)."""
    return recursive_doubling.plan(t, ReduceOp.SUM, _WORD, count * _WORD.itemsize)


def broadcast(t: Transport, buf: np.ndarray, root: int, fp: Fingerprint,
              sum_words: Optional[Callable[[np.ndarray, Fingerprint], None]] = None) -> None:
    n, rank = t.world_size, t.rank
    if not 0 <= root < n:
        raise ValueError(f"root rank {root} is out of range for world size {n}")
    data = _words(buf.nbytes)
    words = np.zeros(data + n, _WORD)
    if rank == root:
        words.view(np.uint8)[:buf.nbytes] = buf.view(np.uint8)
    words[data + rank] = root + 1
    name, named = split_root(fp.op)  # ranks that passed other roots still exchange
    (sum_words or _sum_words(t))(words, fp if named is None else fp._replace(op=name))
    check_roots((words[data:] - 1).tolist(), fp, t)
    if rank != root:
        buf.view(np.uint8)[:] = words.view(np.uint8)[:buf.nbytes]


def broadcast_plan(t: Transport, nbytes: int, root: int
                   ) -> Callable[[np.ndarray, Fingerprint], None]:
    """``broadcast`` of every buffer of ``nbytes`` bytes from ``root``, its sum planned once."""
    planned = _planned_words(t, _words(nbytes) + t.world_size)
    return lambda buf, fp: broadcast(t, buf, root, fp, planned)


def all_gather(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
    _gathering(t, sendbuf.size, sendbuf.itemsize, _sum_words(t))(sendbuf, recvbuf, fp)


def all_gather_plan(t: Transport, m: int, itemsize: int
                    ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``all_gather`` of every ``sendbuf`` of ``m`` elements of ``itemsize`` bytes, its sum
    planned once."""
    return _gathering(t, m, itemsize, _planned_words(t, t.world_size * _words(m * itemsize)))


def _gathering(t: Transport, m: int, itemsize: int,
               sum_words: Callable[[np.ndarray, Fingerprint], None]
               ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``run(sendbuf, recvbuf, fp)`` for every ``sendbuf`` of ``m`` elements of ``itemsize``
    bytes (``recvbuf`` p times as many, both contiguous: checked by the caller)."""
    n, rank = t.world_size, t.rank
    nbytes = m * itemsize
    slot = _words(nbytes)

    def run(sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
        words = np.zeros(n * slot, _WORD)
        grid = words.view(np.uint8).reshape(n, slot * _WORD.itemsize)
        grid[rank, :nbytes] = sendbuf.view(np.uint8)
        sum_words(words, fp)
        np.copyto(recvbuf.view(np.uint8).reshape(n, nbytes), grid[:, :nbytes])
    return run


def reduce_scatter(t: Transport, sendbuf: np.ndarray, recvbuf: np.ndarray, op: ReduceOp,
                   fp: Fingerprint) -> None:
    whole = sendbuf.copy()
    recursive_doubling.all_reduce(t, whole, ReduceOp.SUM if op is ReduceOp.AVERAGE else op, fp)
    _keep_part(t, whole, recvbuf, op)


def reduce_scatter_plan(t: Transport, dtype: np.dtype, count: int, op: ReduceOp
                        ) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """``reduce_scatter`` of every input of ``count`` elements of ``dtype`` with ``op``, its
    all-reduce planned once (``recursive_doubling.plan``: the same rounds and bits)."""
    summed_op = ReduceOp.SUM if op is ReduceOp.AVERAGE else op
    planned = recursive_doubling.plan(t, summed_op, dtype, count * np.dtype(dtype).itemsize)

    def run(sendbuf: np.ndarray, recvbuf: np.ndarray, fp: Fingerprint) -> None:
        whole = sendbuf.copy()
        planned(whole, fp)
        _keep_part(t, whole, recvbuf, op)
    return run


def _keep_part(t: Transport, whole: np.ndarray, recvbuf: np.ndarray, op: ReduceOp) -> None:
    m = recvbuf.size
    np.copyto(recvbuf, whole[t.rank * m:(t.rank + 1) * m])
    if op is ReduceOp.AVERAGE:  # this rank's part only, as the ring divides its own chunk
        divide_by_count(recvbuf, t.world_size)
