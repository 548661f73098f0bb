"""Broadcast plans up to ``plans.BROADCAST_PLAN_BYTES`` on two ranks: one prepared generation
whose compiled form copies with memcpy (``byte_copies``). Bits equal to the root's around every
threshold and at odd sizes, from both roots, compiled and Python ranks mixed (the compiled ones
checked to run compiled), a late root, a dead root (PeerFailureError naming it), mismatches,
the compiled self-check running the memcpy branch, and plans kept to direct.SMALL_BYTES on
every rank where any rank's ``NEURAL_ARCH_SHM_STORES`` is ``stream``."""
from __future__ import annotations

import os
import time
from contextlib import closing

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import compiled as shm_compiled
from neural_arch.distributed.transports.shm import direct, plans, single_copy
from neural_arch.distributed.transports.shm import writer as shm_writer
from neural_arch.distributed.transports.shm.cross_memory import ENV_SWITCH as PEER_READ_SWITCH
from shm_cases import Calls
from shm_testing import kill_self, run_ranks, shm_names_of

pytest.importorskip("numba", reason="the compiled broadcast needs Numba")
pytestmark = pytest.mark.timeout(60)
INLINE = 256  # byte_copies.INLINE_COPY_BYTES (importing byte_copies imports Numba)
LIMIT = 1 << 20
# bytes: the compiled copy's inline limit and its neighbours, the all-reduce's plan limit, the
# broadcast plans' limit (one byte more takes peer reads or rounds), odd sizes
SIZES = (1, 3, INLINE, INLINE + 1, direct.SMALL_BYTES, direct.SMALL_BYTES + 1, 50_001,
         LIMIT - 1, LIMIT, LIMIT + 1)
PLANNED = 300 << 10  # a planned broadcast above the other plans' limit
LATE_S = 0.3
STREAMED = 512 << 10  # a broadcast a plan takes unless a writer streams


def plan_forms(t) -> set:
    """Where the prepared broadcasts of ``t`` run: 'compiled' or 'python'."""
    return {"compiled" if run.__module__ == shm_compiled.__name__ else "python"
            for key, run in t.collectives.plans.items() if key[0] == "broadcast"}


def exact_from_every_root(rank, p, store, forms, peer_reads):
    """Each size from each root, twice (both halves of the workspace), as float16 where it
    divides (Numba has none: the kernel copies bytes) and as bytes elsewhere."""
    os.environ[shm_compiled.ENV_CHOICE] = forms[rank]
    os.environ[PEER_READ_SWITCH] = peer_reads
    with closing(shm.create(rank, p, store, 20.0)) as t:
        calls, failures, planned = Calls(), [], set()
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
        return (failures, sorted(planned), t.peer_reads.usable, plan_forms(t),
                shm_compiled.why_not_compiled())


@pytest.mark.parametrize("forms,peer_reads", [
    (("compiled", "compiled"), "auto"), (("compiled", "python"), "auto"),
    (("python", "compiled"), "auto"), (("compiled", "compiled"), "0")])
def test_two_ranks_get_the_roots_bits_around_every_threshold(tmp_path, forms, peer_reads):
    results = run_ranks(2, exact_from_every_root, forms, peer_reads, store_dir=str(tmp_path),
                        timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        failures, planned, reading, kinds, why = r.value
        assert failures == [], f"rank {r.rank} ({forms[r.rank]}): {failures}"
        # a failed build or self-check would leave the compiled ranks in Python, unnoticed
        assert kinds == {forms[r.rank]}, (r.rank, kinds, why)
        # one generation each up to the plans' limit; where the ranks read each other's
        # memory, from single_copy's size on they read the root's buffer instead
        limit = single_copy.BROADCAST_MIN_BYTES[2] - 1 if reading else LIMIT
        assert planned == sorted(s for s in SIZES if s <= limit), (planned, reading)
    assert shm_names_of(r.pid for r in results) == []


def root_late_or_dead(rank, p, store, then):
    """Rank 0, the root, broadcasts LATE_S late (``then`` = "late") or dies instead ("die");
    rank 1 reads with the compiled plan, whose kernel is loaded: it comes on time."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled"
    with closing(shm.create(rank, p, store, 10.0)) as t:
        calls, c = Calls(), t.collectives
        source = (np.arange(PLANNED) % 251).astype(np.uint8)
        warm = np.zeros(PLANNED, np.uint8)
        c.broadcast(warm, 0, calls.fp("broadcast:0", warm))
        c.barrier(calls.fp("barrier", warm[:0]))  # both start the clock together
        buf = source.copy() if rank == 0 else np.zeros(PLANNED, np.uint8)
        fp = calls.fp("broadcast:0", buf)
        start = time.monotonic()
        if rank == 0:
            time.sleep(LATE_S)
            if then == "die":
                kill_self()
        c.broadcast(buf, 0, fp)
        took = time.monotonic() - start
        c.barrier(calls.fp("barrier", buf[:0]))  # the root left early: settle before closing
        return took, buf.tobytes() == source.tobytes(), plan_forms(t)


def test_a_reader_waits_for_a_late_root(tmp_path):
    results = run_ranks(2, root_late_or_dead, "late", store_dir=str(tmp_path), timeout=30)
    assert all(r.ok for r in results), results
    took, exact, kinds = results[1].value
    assert exact and took >= LATE_S * 0.9 and kinds == {"compiled"}, (took, exact, kinds)


def test_a_dead_root_is_named(tmp_path):
    results = run_ranks(2, root_late_or_dead, "die", store_dir=str(tmp_path), timeout=30)
    assert results[0].exitcode == -9
    reader = results[1]
    assert reader.error == PeerFailureError.__name__ and reader.peer == 0, reader
    assert "peer rank 0" in reader.message, reader.message
    assert shm_names_of(r.pid for r in results) == []


def mismatched_broadcasts(rank, p, store, kind):
    """A planned broadcast against another size or root; then a barrier, where a root that
    left early learns of it."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled"
    with closing(shm.create(rank, p, store, 10.0)) as t:
        calls = Calls()
        n = PLANNED + (4 if kind == "size" and rank == 1 else 0)
        root = rank if kind == "root" else 0
        buf = np.ones(n, np.uint8)
        t.collectives.broadcast(buf, root, calls.fp(f"broadcast:{root}", buf))
        t.collectives.barrier(calls.fp("barrier", buf[:0]))
        return "no error"


@pytest.mark.parametrize("kind", ["size", "root"])
def test_mismatched_planned_broadcasts_are_named_by_both(tmp_path, kind):
    results = run_ranks(2, mismatched_broadcasts, kind, store_dir=str(tmp_path), timeout=30)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        if kind == "size":
            assert r.peer == 1 - r.rank and str(PLANNED) in r.message, r
            assert str(PLANNED + 4) in r.message, r.message
        else:  # every rank's root is named
            assert "rank 0 passed root 0; rank 1 passed root 1" in r.message, r.message
    assert shm_names_of(r.pid for r in results) == []


@pytest.mark.skipif(not shm_compiled.allowed(), reason="Numba is not installed or switched off")
def test_the_self_check_copies_with_memcpy():
    """The check every process runs before compiling its plans broadcasts more bytes than the
    compiled copy keeps inline, so a broken memcpy leaves the plans in Python."""
    built = shm_compiled._kernels()
    assert built is not None, shm_compiled.why_not_compiled()
    kernels, entry = built
    from neural_arch.distributed.transports.shm.byte_copies import INLINE_COPY_BYTES
    assert INLINE_COPY_BYTES == INLINE
    sizes = []

    class Recording:
        """``entry_kernels``, recording the size of each broadcast the check runs."""

        def __getattr__(self, name):
            return getattr(entry, name)

        def planned_broadcast(self, data, *args):
            sizes.append(data.nbytes)
            return entry.planned_broadcast(data, *args)

    shm_compiled._check(kernels, Recording())
    assert max(sizes, default=0) > INLINE_COPY_BYTES, sizes


def read_only_root(rank, p, store):
    """The root's bytes in a read-only array (``np.frombuffer`` of ``bytes``), compiled form
    forced: a broadcast only reads the root's buffer, so it must run and give its bits."""
    os.environ[shm_compiled.ENV_CHOICE] = "compiled"
    with closing(shm.create(rank, p, store, 5.0)) as t:
        calls, got = Calls(), []
        for nbytes in (4, INLINE + 1, PLANNED):
            source = np.random.default_rng(nbytes).integers(0, 256, nbytes, np.uint8)
            buf = np.frombuffer(source.tobytes(), np.uint8) if rank == 0 else np.zeros_like(source)
            t.collectives.broadcast(buf, 0, calls.fp("broadcast", buf))
            got.append(buf.tobytes() == source.tobytes())
        return got, plan_forms(t)


def test_a_read_only_root_buffer_is_broadcast(tmp_path):
    results = run_ranks(2, read_only_root, store_dir=str(tmp_path), timeout=30)
    assert all(r.ok for r in results), results
    assert [r.value for r in results] == [([True] * 3, {"compiled"})] * 2, results


def broadcast_with_stores(rank, p, store, stores):
    """A 512 KiB broadcast from each root with ``stores[rank]`` as this rank's writer choice
    (``writer.ENV_CHOICE``); whether it ran as a plan, and whether its bits are the root's."""
    os.environ[shm_writer.ENV_CHOICE] = stores[rank]
    os.environ[shm_compiled.ENV_CHOICE] = "python"  # the limit, not the form, is tested here
    with closing(shm.create(rank, p, store, 10.0)) as t:
        calls, exact = Calls(), []
        for root in range(p):
            source = np.random.default_rng(root).integers(0, 256, STREAMED, np.uint8)
            buf = source.copy() if rank == root else np.zeros(STREAMED, np.uint8)
            t.collectives.broadcast(buf, root, calls.fp("broadcast", buf))
            exact.append(buf.tobytes() == source.tobytes())
        planned = any(key[:2] == ("broadcast", STREAMED) for key in t.collectives.plans)
        return exact, planned, t.collectives.writer.choice


@pytest.mark.parametrize("stores", [("plain", "plain"), ("stream", "stream"), ("stream", "auto")])
def test_broadcast_plans_stop_at_the_small_limit_where_a_writer_streams(tmp_path, stores):
    """A plan copies with memcpy, not through the writer: where a rank's writer is fixed to
    streaming stores (``NEURAL_ARCH_SHM_STORES=stream``), every rank (the limit picks the
    protocol, so a rank whose own writer is on ``auto`` too) keeps plans to direct.SMALL_BYTES."""
    results = run_ranks(2, broadcast_with_stores, stores, store_dir=str(tmp_path), timeout=30)
    assert all(r.ok for r in results), results
    streamed = "stream" in stores
    for r in results:
        exact, planned, choice = r.value
        assert exact == [True, True] and choice == stores[r.rank], (r.rank, r.value)
        assert planned == (not streamed), (stores, r.rank, planned)
    assert shm_names_of(r.pid for r in results) == []
