"""Broadcast plans in chunks (``broadcast_chunks``): up to PLAN_BYTES on two ranks a broadcast
is one prepared generation whose reader copies each chunk as the root marks it. Bits equal to
the root's around every threshold and at odd sizes, compiled and Python ranks mixed, a root
whose chunks come late or never (it dies: PeerFailureError naming it), and mismatches."""
from __future__ import annotations

import os
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import broadcast_chunks as chunks
from neural_arch.distributed.transports.shm import compiled as shm_compiled
from neural_arch.distributed.transports.shm import direct, single_copy
from neural_arch.distributed.transports.shm.cross_memory import ENV_SWITCH as PEER_READ_SWITCH
from shm_cases import Calls
from shm_testing import kill_self, run_ranks, shm_names_of

pytest.importorskip("numba", reason="the compiled broadcast needs Numba")
pytestmark = pytest.mark.timeout(60)
CHUNK = chunks.CHUNK_BYTES[2]
LIMIT = chunks.PLAN_BYTES[2]
# bytes: one chunk and its neighbours, the all-reduce's plan limit, the broadcast plans' limit
# (one byte more takes peer reads), odd sizes
SIZES = (1, 3, CHUNK - 1, CHUNK, CHUNK + 1, 3 * CHUNK + 5, direct.SMALL_BYTES,
         direct.SMALL_BYTES + 1, 50_001, LIMIT - 1, LIMIT, LIMIT + 1)
LATE_S = 0.3


def exact_from_every_root(rank, p, store, forms, peer_reads):
    """Each size from each root, twice (both halves of the workspace), as float16 where it
    divides (Numba has none: the kernel copies bytes) and as bytes elsewhere."""
    os.environ[shm_compiled.ENV_CHOICE] = forms[rank]
    os.environ[PEER_READ_SWITCH] = peer_reads
    t = shm.create(rank, p, store, 20.0)
    calls, failures, planned = Calls(), [], set()
    try:
        for nbytes in SIZES:
            dtype = np.float16 if nbytes % 2 == 0 else np.uint8
            n = nbytes // np.dtype(dtype).itemsize
            for root in range(p):
                for again in range(2):
                    source = np.random.default_rng([nbytes, root, again]).integers(
                        0, 256, nbytes, np.uint8).view(dtype)
                    buf = source.copy() if rank == root else np.zeros(n, dtype)
                    t.collectives.broadcast(buf, root, calls.fp("broadcast", buf))
                    if buf.tobytes() != source.tobytes():
                        failures.append((nbytes, root, again))
            if ("broadcast", nbytes, 0) in t.collectives.plans:
                planned.add(nbytes)
        return failures, sorted(planned), t.peer_reads.usable
    finally:
        t.close()


@pytest.mark.parametrize("forms,peer_reads", [
    (("compiled", "compiled"), "auto"), (("compiled", "python"), "auto"),
    (("python", "compiled"), "auto"), (("compiled", "compiled"), "0")])
def test_two_ranks_get_the_roots_bits_around_every_threshold(tmp_path, forms, peer_reads):
    results = run_ranks(2, exact_from_every_root, forms, peer_reads, store_dir=str(tmp_path),
                        timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        failures, planned, reading = r.value
        assert failures == [], f"rank {r.rank} ({forms[r.rank]}): {failures}"
        # one generation each up to the plans' limit; where the ranks read each other's
        # memory, from single_copy's size on they read the root's buffer instead
        limit = single_copy.BROADCAST_MIN_BYTES[2] - 1 if reading else LIMIT
        assert planned == sorted(s for s in SIZES if s <= limit), (planned, reading)
    assert shm_names_of(r.pid for r in results) == []


def root_marks_late(rank, p, store, then):
    """Rank 0 plays a broadcast root by hand: it marks one chunk of a 4-chunk broadcast,
    arrives, and then marks the rest LATE_S later (``then`` = "finish") or dies ("die");
    rank 1 broadcasts with the compiled plan."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled"
    t = shm.create(rank, p, store, 10.0)
    calls, c = Calls(), t.collectives
    nbytes = 4 * CHUNK
    source = (np.arange(nbytes) % 251).astype(np.uint8)
    try:
        warm = np.zeros(nbytes, np.uint8)  # the reader's kernel loaded: it comes on time
        c.broadcast(warm, 0, calls.fp("broadcast:0", warm))
        buf = source.copy() if rank == 0 else np.zeros(nbytes, np.uint8)
        fp = calls.fp("broadcast:0", buf)
        if rank == 1:
            start = time.monotonic()
            c.broadcast(buf, 0, fp)
            return time.monotonic() - start, buf.tobytes() == source.tobytes()
        sig = c.signature(fp, nbytes)
        gen = c.next_generation(fp, nbytes, sig)
        area = c.half_inputs(gen & 1)[:nbytes]
        word, mark = chunks.progress_word(c.layout, 0), chunks.mark(gen)
        area[:CHUNK] = buf[:CHUNK]
        t.ctrl[word] = mark + 1
        c.generation.publish(gen, sig, fp.seq)
        c.generation.arrive(gen)
        time.sleep(LATE_S)
        if then == "die":
            kill_self()
        area[CHUNK:] = buf[CHUNK:]
        t.ctrl[word] = mark + 4
        c.sync(gen, fp)
        return "root done"
    finally:
        t.close()


def test_a_reader_waits_for_chunks_marked_late(tmp_path):
    results = run_ranks(2, root_marks_late, "finish", store_dir=str(tmp_path), timeout=30)
    assert all(r.ok for r in results), results
    took, exact = results[1].value
    assert exact and took >= LATE_S * 0.9, (took, exact)


def test_a_root_dying_between_its_chunks_is_named(tmp_path):
    results = run_ranks(2, root_marks_late, "die", store_dir=str(tmp_path), timeout=30)
    assert results[0].exitcode == -9
    reader = results[1]
    assert reader.error == PeerFailureError.__name__ and reader.peer == 0, reader
    assert "peer rank 0" in reader.message, reader.message
    assert shm_names_of(r.pid for r in results) == []


def mismatched_broadcasts(rank, p, store, kind):
    """A chunked broadcast against another size or root; then a barrier, where a root that left
    early learns of it."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled"
    t = shm.create(rank, p, store, 10.0)
    calls = Calls()
    try:
        n = 4 * CHUNK + (4 if kind == "size" and rank == 1 else 0)
        root = rank if kind == "root" else 0
        buf = np.ones(n, np.uint8)
        t.collectives.broadcast(buf, root, calls.fp(f"broadcast:{root}", buf))
        t.collectives.barrier(calls.fp("barrier", buf[:0]))
        return "no error"
    finally:
        t.close()


@pytest.mark.parametrize("kind", ["size", "root"])
def test_mismatched_chunked_broadcasts_are_named_by_both(tmp_path, kind):
    results = run_ranks(2, mismatched_broadcasts, kind, store_dir=str(tmp_path), timeout=30)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        if kind == "size":
            assert r.peer == 1 - r.rank and "65536" in r.message and "65540" in r.message, r
        else:  # every rank's root is named
            assert "rank 0 passed root 0; rank 1 passed root 1" in r.message, r.message
    assert shm_names_of(r.pid for r in results) == []
