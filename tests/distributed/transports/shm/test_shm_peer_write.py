"""The two-rank broadcast that splits its one copy between the root's write into the reader
(``process_vm_writev``) and the reader's read of the root: the root's bytes on the reader, the
split where ``root_writes`` puts it, the ranks' agreement on writes (a rank whose switch allows
reads only turns writes off for both, reads stay), ranks that disagree on the root refused
before anything is written, and a failed write named."""
from __future__ import annotations

import os

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import cross_memory, single_copy
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
from shm_cases import Calls
from shm_testing import run_ranks
from test_shm_peer_read import needs_peer_reads

pytestmark = pytest.mark.timeout(60)

LEAST = single_copy.BROADCAST_MIN_BYTES[2]
SIZES = (LEAST, LEAST + 3, LEAST + 64 * 7 + 61)  # bytes: even, odd, neither half on a line


def _probe() -> int:
    reads = cross_memory.PeerReads(0, 2)
    reads.pids = [os.getpid()] * 2
    try:
        return reads.probe_peer(os.getpid(), int(reads.probe[0]), reads.probe.ctypes.data)
    finally:
        reads.close()


PROBED = _probe()
needs_peer_writes = pytest.mark.skipif(not PROBED & cross_memory.WRITES,
                                       reason="this machine refuses cross-memory writes")


def split_broadcasts(rank, p, store, refuse_writes_on):
    """Broadcasts of every size in SIZES from both roots by the public call; returns whether
    writes were agreed, the (size, root) cases whose bytes differ from the root's, and the
    bytes this rank wrote and read in each case."""
    if rank in refuse_writes_on:  # this rank's switch allows reads only
        os.environ[cross_memory.ENV_SWITCH] = "read"
    t = shm.create(rank, p, store, 30.0)
    reads, calls, wrong, moved = t.peer_reads, Calls(), [], []
    real_read, real_write = reads.read, reads.write

    def read(peer, address, out, op, seq):
        moved.append(("read", out.nbytes))
        real_read(peer, address, out, op, seq)

    def write(peer, address, data, op, seq):
        moved.append(("write", data.nbytes))
        real_write(peer, address, data, op, seq)
    reads.read, reads.write = read, write
    try:
        for nbytes in SIZES:
            for root in range(p):
                data = np.random.default_rng([root, nbytes]).integers(0, 256, nbytes, np.uint8)
                buf = data.copy() if rank == root else np.zeros(nbytes, np.uint8)
                if rank == root:
                    buf.flags.writeable = False  # the root's buffer is only read
                t.collectives.broadcast(buf, root, calls.fp(f"broadcast:{root}", buf))
                if buf.tobytes() != data.tobytes():
                    wrong.append((nbytes, root))
        return reads.usable, reads.writable, wrong, moved
    finally:
        t.close()


@pytest.mark.parametrize("refuse_writes_on", [pytest.param((), marks=needs_peer_writes),
                                              pytest.param((1,), marks=needs_peer_reads)])
def test_two_rank_broadcast_splits_its_copy_where_both_ranks_can_write(tmp_path,
                                                                      refuse_writes_on):
    results = run_ranks(2, split_broadcasts, refuse_writes_on, store_dir=str(tmp_path),
                        timeout=50)
    assert all(r.ok for r in results), results
    writes = not refuse_writes_on
    for r in results:
        usable, writable, wrong, moved = r.value
        assert (usable, writable) == (True, writes), r.value[:2]
        assert wrong == [], f"rank {r.rank}: {wrong}"
        expected = []
        for nbytes in SIZES:
            for root in range(2):
                split = single_copy.root_writes(nbytes) if writes else 0
                assert 0 < single_copy.root_writes(nbytes) < nbytes
                assert single_copy.root_writes(nbytes) % 64 == 0
                if r.rank == root:
                    expected += [("write", split)] if split else []
                else:
                    expected.append(("read", nbytes - split))
        assert moved == expected, f"rank {r.rank}: {moved}"


def disagreeing_roots(rank, p, store):
    """Each rank calls the single-copy broadcast naming itself the root, under a fingerprint
    that does not name the root (as no public call makes): both must refuse before writing."""
    t = shm.create(rank, p, store, 30.0)
    try:
        buf = np.full(LEAST, rank + 1, np.uint8)
        try:
            single_copy.broadcast(t.collectives, buf, rank, Calls().fp("broadcast", buf))
            outcome = "no error"
        except CollectiveMismatchError as e:
            outcome = str(e)
        return outcome, bool((buf == rank + 1).all())
    finally:
        t.close()


@needs_peer_writes
def test_ranks_that_disagree_on_the_root_both_raise_before_writing(tmp_path):
    results = run_ranks(2, disagreeing_roots, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        outcome, untouched = r.value
        assert f"rank {r.rank} takes rank {r.rank} as the root" in outcome, outcome
        assert "[0, 1]" in outcome and untouched, r.value


@needs_peer_writes
def test_a_write_to_an_unmapped_address_raises_naming_the_peer():
    reads = cross_memory.PeerReads(0, 2)
    reads.pids = [os.getpid()] * 2
    try:
        with pytest.raises(PeerFailureError,
                           match=r"writing 16 bytes of peer rank 1.*EFAULT") as info:
            reads.write(1, 8, np.zeros(16, np.uint8), "broadcast:0", 7)
    finally:
        reads.close()
    assert "broadcast:0 #7" in str(info.value) and info.value.peer == 1


def test_the_probe_writes_only_its_own_slot_of_the_peers_copy():
    reads = cross_memory.PeerReads(1, 3)
    reads.pids = [os.getpid()] * 3
    target = cross_memory.PeerReads(0, 3)
    token = int(target.probe[0])
    try:
        verdict = reads.probe_peer(os.getpid(), token, target.probe.ctypes.data)
    finally:
        reads.close()
        target.close()
    assert verdict == PROBED, (verdict, PROBED)
    if verdict & cross_memory.WRITES:  # rank 1's slot holds its token, the rest unchanged
        assert target.probe.tolist() == [token, 0, int(reads.probe[0]), 0]
