"""Prepared one-generation collectives for small vectors on the shared-memory workspace.

On a vector of a few bytes, looking up views, control words and signatures is most of a
direct collective's time. A prepared collective does what ``shm_generations.begin`` and
``sync`` do, in the same layout and with the same checks, but with everything that stays the
same from call to call (views, control-word indices, the last signature) looked up once, when
it is built. The transport keeps the built closures in ``direct_views``, so a rank on the
prepared path and a rank on the general one meet in the same generation.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from ..reduce_ops import ReduceOp, averager, ufunc_for
from ..transports.base import Fingerprint
from ..transports.shm import ShmTransport
from ..transports.shm_sync import LINE_WORDS, SEQ0, SIG0
from .shm_generations import check_open, mismatch, publish, signature, workspace_views


class _Generation:
    """``begin`` (``open``) and ``sync`` (``meet``) of one rank, prepared for ``nbytes``."""

    def __init__(self, t: ShmTransport, nbytes: int) -> None:
        self.t, self.nbytes, rank = t, nbytes, t.rank
        peers = t.layout.peers[rank]
        self.peer_gen_words = tuple(t.layout.gen_words[q] for q in peers)
        self.peer_lines = tuple(tuple((q, q * LINE_WORDS + 2 * h) for q in peers) for h in (0, 1))
        self.own_lines = tuple(rank * LINE_WORDS + 2 * h for h in (0, 1))
        self.signed: list = [None, 0]  # the fingerprint (but its seq) last signed, its signature

    def open(self, fp: Fingerprint) -> int:
        """Publish ``fp`` for the next generation and return that generation."""
        t, signed = self.t, self.signed
        if t._closed:
            check_open(t, fp)  # raises
        key = (fp.op, fp.dtype, fp.count, fp.group)
        if key != signed[0]:
            signed[:] = key, signature(t, fp, self.nbytes)
        sig, gen = signed[1], t.gen + 1
        half = gen & 1
        if t.header_sigs[half] != sig:
            publish(t, half, fp, self.nbytes, sig)
        else:  # what publish does when the header is in place already
            t.ctrl[self.own_lines[half] + SIG0] = sig
            t.ctrl[self.own_lines[half] + SEQ0] = fp.seq
        return gen

    def meet(self, gen: int, fp: Fingerprint) -> None:
        """Arrive at ``gen``, wait for every rank, and check that all called ``fp``."""
        t, ctrl, sig, seq = self.t, self.t.ctrl, self.signed[1], fp.seq
        t.arrive(gen)
        for word in self.peer_gen_words:
            if ctrl[word] < gen:
                t.wait_arrivals(gen, fp.op, seq)
                break
        for peer, line in self.peer_lines[gen & 1]:
            if ctrl[line + SIG0] != sig or ctrl[line + SEQ0] != seq:
                mismatch(t, gen, fp, peer)


def all_reduce(t: ShmTransport, dtype: np.dtype, n: int,
               op: ReduceOp) -> Callable[[np.ndarray, Fingerprint], None]:
    """A one-barrier all-reduce of ``n`` elements: everyone publishes its vector, then reduces
    all of them in rank order (so every rank ends with the same bits)."""
    inputs, _ = workspace_views(t, dtype)
    halves = tuple(tuple(a[:n] for a in inputs[h]) for h in (0, 1))
    ufunc, average = ufunc_for(op), op is ReduceOp.AVERAGE
    scale, factor = averager(dtype, t.world_size)
    generation, rank = _Generation(t, n * dtype.itemsize), t.rank

    def run(buf: np.ndarray, fp: Fingerprint) -> None:
        gen = generation.open(fp)
        slots = halves[gen & 1]
        slots[rank][...] = buf
        generation.meet(gen, fp)
        ufunc(slots[0], slots[1], out=buf)
        for other in slots[2:]:
            ufunc(buf, other, out=buf)
        if average:
            scale(buf, factor, out=buf)
    return run


def broadcast(t: ShmTransport, nbytes: int,
              root: int) -> Callable[[np.ndarray, Fingerprint], None]:
    """A one-barrier broadcast of ``nbytes`` from ``root``, through the first input area of the
    generation's half (where the general broadcast puts it too)."""
    starts = tuple(t.layout.ws_input(h, 0) for h in (0, 1))
    areas = tuple(t.shared[start:start + nbytes] for start in starts)
    generation, is_root = _Generation(t, nbytes), t.rank == root

    def run(data: np.ndarray, fp: Fingerprint) -> None:
        gen = generation.open(fp)
        if is_root:
            areas[gen & 1][...] = data
        generation.meet(gen, fp)
        if not is_root:
            data[...] = areas[gen & 1]
    return run


def all_gather(t: ShmTransport, dtype: np.dtype,
               n: int) -> Callable[[np.ndarray, np.ndarray, Fingerprint], None]:
    """A one-barrier all-gather of ``n`` elements per rank: everyone publishes its block in its
    own input area of the generation's half (as the general all-gather does), then copies all
    of them out in rank order."""
    inputs, _ = workspace_views(t, dtype)
    areas = tuple(tuple(a[:n] for a in inputs[h]) for h in (0, 1))
    generation, rank = _Generation(t, n * dtype.itemsize), t.rank

    def run(src: np.ndarray, dst: np.ndarray, fp: Fingerprint) -> None:
        gen = generation.open(fp)
        blocks = areas[gen & 1]
        blocks[rank][...] = src
        generation.meet(gen, fp)
        np.concatenate(blocks, out=dst)
    return run
