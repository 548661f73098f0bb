"""A broadcast plan's data in chunks: the reader copies chunk k out while the root copies k + 1 in.

A broadcast plan (``plans``) moves its bytes through the first input area of the generation's
half: the root copies them in, the readers copy them out. Done one after the other, the two
copies cost twice one copy; on two ranks a 64 KiB broadcast took 2.5x MPI_Bcast's time. So
the root copies its bytes in chunks of ``chunk_bytes``. It arrives at the generation once its
first chunk is in place (so the readers check every fingerprint before they copy anything, as
always, and a mismatched call copies nothing; and a one-chunk broadcast, every small one, takes
the steps it took before chunks); after each later chunk it stores in its PROGRESS word
(``layout``) how many chunks of this generation are in place, as ``mark(gen) + chunks``, and a
reader copies each chunk out as soon as the word says it is there.

The word only grows: a generation's marks lie above every mark of the generations before, so a
reader never takes a previous generation's progress for its own. A root reaches its next
generation's half only once every reader arrived at the one after (``generation``), so the
half a reader copies from is never rewritten under it.

Both forms of a plan keep this protocol, so a rank running the Python form meets one running
the compiled form: the Python root copies every chunk and marks them all before it arrives;
a Python reader waits until every chunk is marked, then copies them all. A compiled reader
polls the word within a budget; when the root is slow (descheduled, or dead) it hands over to
``wait_for_data``, bounded by the timeout and watching the root's liveness.
"""
from __future__ import annotations

from typing import Any, Optional

from ..base import Fingerprint
from .layout import PROGRESS
from .waiting import wait_ge

# Broadcast plans (one generation, chunked as above) up to this many bytes per world size, and
# below the size from which the ranks read the root's buffer instead where they can
# (``single_copy.BROADCAST_MIN_BYTES``); larger broadcasts take ``direct`` or ``single_copy``.
# Other world sizes keep direct.SMALL_BYTES. Measured at p = 2 on two cores, in turns with
# MPI_Bcast in the same processes (``benchmarks/pair_shm_mpi.py``), time over MPI_Bcast's: at
# 256 KiB the plan 1.3-1.6x, the round-based workspace broadcast 1.9-2.6x; at 512 KiB the plan
# 1.6x, peer reads 1.75-1.9x; at 1 MiB the plan 1.9-2.1x, peer reads 1.55-1.95x.
PLAN_BYTES = {2: 1 << 20}
# Chunks per world size (two ranks: each on its own core); other world sizes copy in one chunk,
# which is the order of the unchunked broadcast (ranks outnumber cores there: a reader polling
# for chunks would take the core from the root that writes them). At p = 2, 8 KiB to 64 KiB
# chunks and one chunk took the same time within the noise at 64 KiB-1 MiB (the copies, now
# one memcpy each, and not their order, were most of the time); 16 KiB chunks stand.
CHUNK_BYTES = {2: 16 << 10}
PROGRESS_STEP = 1 << 16  # marks per generation: more than any plan's chunks
DATA_POLLS = 1 << 14     # a resumed compiled reader's polls per chunk (its data is in place)


def plan_bytes(world_size: int, small_bytes: int, workspace_bytes: int,
               peer_reads_from: Optional[int] = None) -> int:
    """The largest broadcast (bytes) a plan takes on ``world_size`` ranks; ``peer_reads_from``:
    the size from which this job's broadcasts read the root's buffer (None: never)."""
    most = min(max(PLAN_BYTES.get(world_size, 0), small_bytes), workspace_bytes)
    return most if peer_reads_from is None else min(most, max(peer_reads_from - 1, small_bytes))


def chunk_bytes(world_size: int, nbytes: int) -> int:
    """The chunk of a ``nbytes`` broadcast plan on ``world_size`` ranks (at least 1 byte, and
    few enough chunks for PROGRESS_STEP)."""
    chunk = CHUNK_BYTES.get(world_size, nbytes)
    return max(1, chunk, -(-nbytes // (PROGRESS_STEP - 1)))


def chunk_count(nbytes: int, chunk: int) -> int:
    """How many chunks a ``nbytes`` broadcast has (one even when it is empty)."""
    return max(1, -(-nbytes // chunk))


def mark(gen: int) -> int:
    """The PROGRESS word's value at generation ``gen`` before any chunk is in place."""
    return gen * PROGRESS_STEP


def progress_word(layout: Any, root: int) -> int:
    """The index of ``root``'s PROGRESS word among the control words."""
    return layout.rank_word(root, PROGRESS)


def wait_for_data(c: Any, root: int, gen: int, count: int, fp: Fingerprint) -> None:
    """Block until ``root`` marked all ``count`` chunks of generation ``gen`` (bounded by the
    timeout; PeerFailureError if the root dies or closes meanwhile). The first chunk came with
    the root's arrival: a one-chunk broadcast has nothing to wait for."""
    if count <= 1:
        return
    t = c.t
    wait_ge(t.ctrl, progress_word(c.layout, root), mark(gen) + count, root, t.watch, t.timeout,
            fp.op, fp.seq, f"the broadcast's data from its root, rank {root} (generation {gen})")
