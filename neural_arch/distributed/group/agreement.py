"""The checks that every rank of a group made the same call with the same arguments, and that
every rank of a job reads the collectives' settings alike.

They live with the groups because ``new_group`` and ``init_process_group`` need them before any
collective above the groups exists; the collectives (DDP's bucket layout,
``collectives.objects``) use the first too.
"""
from __future__ import annotations

import zlib
from typing import Sequence

import numpy as np

from .. import algorithms
from ..transports.base import Fingerprint, Transport, who_chose
from .process_group import ProcessGroup

# A rank's setting in the all-gather of ``check_environment_agrees``: a CRC of the whole text,
# whether the text is longer than the bytes shown, then its first bytes, which the error shows
_SHOWN_BYTES = 40
_CUT_AT, _TEXT_AT = 4, 5


def check_same_everywhere(pg: ProcessGroup, op: str, values: Sequence[int], what: str) -> None:
    """ValueError on every rank unless all ranks passed the same ``values``."""
    mine = np.ascontiguousarray(np.asarray(values, dtype=np.int64).reshape(-1))
    fp = pg.fingerprint(op, mine.dtype, mine.size)
    rows = np.empty((pg.size, mine.size), dtype=np.int64)
    pg.run(lambda: algorithms.all_gather(pg.transport, mine, rows.reshape(-1), fp), False, fp, op)
    differ = [pg.ranks[i] for i in range(pg.size) if not np.array_equal(rows[i], rows[0])]
    if differ:
        raise ValueError(f"{what}: ranks {differ} passed different arguments than rank "
                         f"{pg.ranks[0]} (every rank must make the same call)")


def check_environment_agrees(t: Transport) -> None:
    """ValueError on every rank unless every rank of ``t``'s job reads
    ``NEURAL_ARCH_ALLREDUCE_ALGO`` to mean the same (``algorithms.environment_meaning``).

    ``init_process_group`` ends with it in place of a barrier: an all-gather returns on a rank
    only once every rank contributed, which is what that barrier ensured. Ranks forcing
    different all-reduce algorithms would otherwise run on: the mpi transport's recursive
    doubling and two-rank ring exchange the same message at some sizes, and end with bits
    that differ where the operand order shows (a zero's sign, a NaN's payload)."""
    meaning = algorithms.environment_meaning()
    text = meaning.encode(errors="replace")
    mine = np.zeros(_TEXT_AT + _SHOWN_BYTES, np.uint8)
    mine[:_CUT_AT].view("<u4")[0] = zlib.crc32(text)
    mine[_CUT_AT] = len(text) > _SHOWN_BYTES
    shown = text[:_SHOWN_BYTES]
    mine[_TEXT_AT:_TEXT_AT + len(shown)] = np.frombuffer(shown, np.uint8)
    rows = np.empty((t.world_size, mine.size), np.uint8)
    algorithms.all_gather(t, mine, rows.reshape(-1),
                          Fingerprint("init_agreement", 0, "uint8", mine.size, 0), "auto")
    if (rows == rows[0]).all():
        return
    # a cut text names its CRC too: two long ones alike in their first bytes stay apart
    values = [row[_TEXT_AT:].tobytes().rstrip(b"\0").decode(errors="replace")
              + (f"... (CRC {row[:_CUT_AT].view('<u4')[0]:08x})" if row[_CUT_AT] else "")
              for row in rows]
    raise ValueError(
        f"{algorithms.ENV_ALLREDUCE_ALGO} must mean the same on every rank: "
        f"{who_chose(values, 'read it as {!r}')} (unset, empty and 'auto' alike mean 'auto'); "
        "set it alike on every rank, or on none")
