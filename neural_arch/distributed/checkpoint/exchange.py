"""What checkpointing ranks tell each other: small JSON values over int32 tensors (the object
collectives would pickle), and whether an operation succeeded everywhere, so that one rank's
failure fails every rank."""
from __future__ import annotations

import json
from typing import Any, List, Optional

import numpy as np

from ..collectives import all_gather, all_reduce, broadcast
from ..errors import DistributedError
from ..reduce_ops import ReduceOp


# Collectives carry int32 words: JSON text is padded with NUL bytes, which JSON never contains.
def _to_words(obj: Any) -> np.ndarray:
    data = json.dumps(obj).encode("utf-8")
    return np.frombuffer(data + b"\0" * (-len(data) % 4), dtype=np.int32).copy()


def _from_words(words: np.ndarray) -> Any:
    return json.loads(words.astype(np.int32).tobytes().rstrip(b"\0"))


def gather_json(pg: Any, obj: Any) -> List[Any]:
    """Every rank's ``obj``, in group rank order, on every rank."""
    mine = _to_words(obj)
    sizes = [int(s[0]) for s in all_gather(np.array([mine.size], dtype=np.int64), group=pg)]
    padded = np.zeros(max(sizes), dtype=np.int32)
    padded[:mine.size] = mine
    return [_from_words(row[:size]) for row, size in zip(all_gather(padded, group=pg), sizes)]


def broadcast_json(pg: Any, obj: Any) -> Any:
    """Group rank 0's ``obj`` on every rank."""
    root = pg.ranks[0]
    words = _to_words(obj) if pg.rank == 0 else None
    size = np.array([words.size if words is not None else 0], dtype=np.int64)
    broadcast(size, src=root, group=pg)
    if words is None:
        words = np.empty(int(size[0]), dtype=np.int32)
    broadcast(words, src=root, group=pg)
    return _from_words(words)


def all_succeeded(pg: Any, ok: bool) -> bool:
    """Whether ``ok`` holds on every rank; also a barrier."""
    flag = np.array([0 if ok else 1], dtype=np.int32)
    all_reduce(flag, ReduceOp.MAX, group=pg)
    return int(flag[0]) == 0


def fail_together(pg: Any, failure: Optional[BaseException], message: str, *, op: str,
                  peer: Optional[int] = None) -> None:
    """Return only when no rank of ``pg`` failed; otherwise raise on every rank: its own
    ``failure`` where it had one, else a ``DistributedError`` with ``message``, so that no rank
    goes on alone."""
    if not all_succeeded(pg, failure is None):
        if failure is not None:
            raise failure
        raise DistributedError(message, rank=pg.global_rank, peer=peer, op=op)
