"""The generations of the shared-memory workspace that the direct collectives run on.

A generation is a barrier on per-rank arrival counters. The workspace has two halves, used by
alternate generations; at generation g (half q = g % 2) a rank

* before arriving: writes only input areas of half q (its own; a broadcast root all of them);
* after every rank arrived: reads any input area of half q, writes only its own slice of the
  result area of half q, and reads result areas of the other half (written at g - 1).

A peer's reads of a half end before it arrives at the next generation, and nobody writes the
same half again before waiting for that arrival, so two halves suffice with one barrier per
round. The first generation of every collective also carries a signature of its fingerprint,
so ranks that call different collectives raise CollectiveMismatchError naming both sides.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..errors import CollectiveMismatchError, DistributedError
from ..transports.base import HEADER_SIZE, Fingerprint, pack_header, unpack_header
from ..transports.shm import ShmTransport
from ..transports.shm_sync import LINE_WORDS, SEQ0, SIG0


def begin(t: ShmTransport, fp: Fingerprint, nbytes: int) -> tuple[int, int]:
    """Publish this rank's fingerprint for the next generation; return (generation, signature)."""
    check_open(t, fp)
    gen, sig = t.gen + 1, signature(t, fp, nbytes)
    publish(t, gen & 1, fp, nbytes, sig)
    return gen, sig


def check_open(t: ShmTransport, fp: Fingerprint) -> None:
    """Raise DistributedError if ``t`` was closed (its shared memory is gone)."""
    if t._closed:
        raise DistributedError("the shared-memory transport is closed", rank=t.rank, op=fp.op,
                               seq=fp.seq)


def signature(t: ShmTransport, fp: Fingerprint, nbytes: int) -> int:
    """A nonzero 64-bit word that differs between collectives a rank must not mix up."""
    key = (fp.op, fp.dtype, fp.count, fp.group, nbytes)
    sig = t.direct_sigs.get(key)
    if sig is None:
        if len(t.direct_sigs) > 4096:
            t.direct_sigs.clear()
        sig = zlib.crc32(pack_header(fp._replace(seq=0), nbytes)) + 1
        t.direct_sigs[key] = sig
    return sig


def publish(t: ShmTransport, half: int, fp: Fingerprint, nbytes: int, sig: int) -> None:
    """Write the signature and sequence number (and, if it changed, the full header that a
    peer decodes to name a mismatch) for the generation of parity ``half``."""
    if t.header_sigs[half] != sig:
        start = t.layout.rank_header(t.rank, half)
        t.shared[start:start + HEADER_SIZE] = np.frombuffer(
            pack_header(fp._replace(seq=0), nbytes), np.uint8)
        t.header_sigs[half] = sig
    line = t.rank * LINE_WORDS + 2 * half
    t.ctrl[line + SIG0] = sig
    t.ctrl[line + SEQ0] = fp.seq


def sync(t: ShmTransport, gen: int, fp: Fingerprint, sig: int = 0) -> None:
    """Arrive at ``gen``, wait for every rank; with ``sig``, check everyone's fingerprint."""
    t.arrive(gen)
    t.wait_arrivals(gen, fp.op, fp.seq)
    if sig:
        ctrl, line = t.ctrl, 2 * (gen & 1)
        for peer in t.layout.peers[t.rank]:
            base = peer * LINE_WORDS + line
            if ctrl[base + SIG0] != sig or ctrl[base + SEQ0] != fp.seq:
                mismatch(t, gen, fp, peer)


def mismatch(t: ShmTransport, gen: int, fp: Fingerprint, peer: int) -> None:
    """Raise CollectiveMismatchError naming ``fp`` and what ``peer`` published at ``gen``."""
    half = gen & 1
    start = t.layout.rank_header(peer, half)
    seq = t.ctrl[peer * LINE_WORDS + 2 * half + SEQ0]
    try:
        got, nbytes = unpack_header(bytes(t.shared[start:start + HEADER_SIZE]))
        theirs = f"{got._replace(seq=seq).describe()} with {nbytes} bytes"
    except ValueError:
        theirs = "something that is not a direct shared-memory collective"
    raise CollectiveMismatchError(
        f"expected {fp.describe()} but peer rank {peer} called {theirs}: ranks called different "
        "collectives", rank=t.rank, peer=peer, op=fp.op, seq=fp.seq)


def workspace_views(t: ShmTransport, dtype: np.dtype):
    """Typed views of the workspace: ``inputs[half][rank]`` and ``results[half]``."""
    views = t.direct_views.get(dtype)
    if views is None:
        size, layout = t.layout.workspace_bytes, t.layout

        def area(start: int) -> np.ndarray:
            return t.shared[start:start + size].view(dtype)

        inputs = [[area(layout.ws_input(h, r)) for r in range(t.world_size)] for h in (0, 1)]
        results = [area(layout.ws_result(h)) for h in (0, 1)]
        views = t.direct_views[dtype] = (inputs, results)
    return views
