"""The shared-memory all-reduce and broadcast by peer reads (cross-memory attach): the bits of
a NumPy reference and of the workspace algorithms on every rank, with and without peer writes
(an owner writing its reduced slice into its peers), the ranks' agreement at set-up,
the switch that turns it off, mismatched calls refused, and a peer that dies mid-call named."""
from __future__ import annotations

import contextlib
import hashlib
import os
import time

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.reductions import kernels as reduction_kernels
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import cross_memory, direct, single_copy, tuning
from neural_arch.distributed.transports.shm.tuning import Choice
from neural_arch.distributed.transports.shm.waiting import pid_alive
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
from shm_cases import Calls, rank_order_reduction
from shm_testing import DirStore, kill_self, run_ranks

pytestmark = pytest.mark.timeout(60)

CHUNK = Choice("peer_read", 4096)  # many chunks even in the small cases
SIZES = (1, 2, 13, 40_009)
LARGE = 1_048_583  # elements: 4 MiB of float32, an odd count
PAIR_N = tuning.PEER_READ_MIN_BYTES[2] // 4 + 1  # float32: two ranks take peer reads by default


def _probe_works() -> bool:
    reads = cross_memory.PeerReads(0, 2)
    reads.pids = [os.getpid()] * 2
    out = np.zeros(1, np.int64)
    try:
        reads.read(1, reads.probe.ctypes.data, out, "probe", None)
    except (PeerFailureError, TypeError):
        return False
    finally:
        reads.close()
    return int(out[0]) == int(reads.probe[0])


def _writes_work() -> bool:
    reads = cross_memory.PeerReads(0, 2)
    reads.pids = [os.getpid()] * 2
    try:
        verdict = reads.probe_peer(os.getpid(), int(reads.probe[0]), reads.probe.ctypes.data)
    finally:
        reads.close()
    return bool(verdict & cross_memory.WRITES)


reduction_kernels.kernels()  # compiled here, once: the forked ranks inherit them
needs_peer_reads = pytest.mark.skipif(not _probe_works(),
                                      reason="this machine refuses cross-memory reads")


@pytest.fixture(autouse=True)
def built_in_choices(built_in_table, monkeypatch):
    """The ranks (forked from this process) follow the built-in choice, which takes peer reads
    from PEER_READ_MIN_BYTES at two ranks where they pay (``on``: taken as paying, untimed)."""
    monkeypatch.setenv(cross_memory.ENV_SWITCH, "on")


def _inputs(p: int, n: int, dtype, op: ReduceOp) -> list:
    rngs = [np.random.default_rng([r, n, np.dtype(dtype).num, ord(op.name[0])]) for r in range(p)]
    if np.dtype(dtype).kind == "i":
        return [g.integers(-1000, 1000, n).astype(dtype) for g in rngs]
    return [g.uniform(-2.0, 2.0, n).astype(dtype) for g in rngs]


def _reference(inputs: list, op: ReduceOp) -> np.ndarray:
    if op is ReduceOp.MAX:
        return np.maximum.reduce(inputs)
    return rank_order_reduction(inputs, op)


def peer_read_bits(rank, p, store, writes):
    """Every case by peer reads and by the workspace algorithm: returns (cases whose bits differ
    from the reference or from the workspace's, digests, whether peer reads were agreed, and
    peer writes). ``writes`` False: rank 0 says it cannot write (each owner's slice then goes
    out by the peers' reads, else by its owner's writes)."""
    if not writes and rank == 0:
        cross_memory.PeerReads.probe_peer = lambda self, *args: cross_memory.READS
    t = shm.create(rank, p, store, 30.0)
    c, calls, wrong, digests = t.collectives, Calls(), [], []
    workspace_way = tuning.default_choice(p)
    moved, real_read, real_write = [], t.peer_reads.read, t.peer_reads.write
    t.peer_reads.read = lambda *args: moved.append("read") or real_read(*args)
    t.peer_reads.write = lambda *args: moved.append("write") or real_write(*args)
    try:
        cases = [(n, dtype, op) for n in SIZES for dtype in (np.float32, np.float64, np.float16,
                                                             np.int32)
                 for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MAX)
                 if op is not ReduceOp.AVERAGE or np.dtype(dtype).kind == "f"]
        cases += [(LARGE, np.float32, ReduceOp.SUM), (LARGE, np.float16, ReduceOp.AVERAGE)]
        for n, dtype, op in cases:
            inputs = _inputs(p, n, dtype, op)
            expected = _reference(inputs, op)
            fast, old = inputs[rank].copy(), inputs[rank].copy()
            if p == 2 and fast.nbytes >= tuning.PEER_READ_MIN_BYTES[2]:  # the public call
                level = tuning.peer_level(t.peer_reads.usable, t.peer_reads.writable)
                chosen = tuning.decide(p, fast.nbytes, c.layout.workspace_bytes, level,
                                       t.peer_reads.pays)[0]
                assert chosen.algorithm == "peer_read", chosen  # else it tests nothing new
                c.all_reduce(fast, op, calls.fp("all_reduce", fast))
            else:
                chunk = CHUNK if n < LARGE else Choice("peer_read", 256 << 10)
                direct.all_reduce(c, fast, op, calls.fp("all_reduce", fast), chunk)
            direct.all_reduce(c, old, op, calls.fp("all_reduce", old), workspace_way)
            for name, got in (("reference", expected), ("workspace", old)):
                if fast.tobytes() != got.tobytes():
                    wrong.append((name, n, np.dtype(dtype).name, op.name))
            digests.append(hashlib.sha256(fast.tobytes()).hexdigest())
        return wrong, digests, t.peer_reads.usable, t.peer_reads.writable, sorted(set(moved))
    finally:
        t.close()


@needs_peer_reads
@pytest.mark.parametrize("p,writes", [(2, True), (2, False), (3, True), (3, False), (4, True)])
def test_peer_read_all_reduce_has_the_reference_and_workspace_bits(tmp_path, p, writes):
    results = run_ranks(p, peer_read_bits, writes, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    writes_agreed = writes and _writes_work()
    for r in results:
        wrong, digests, usable, writable, moved = r.value
        assert usable is True, f"rank {r.rank} did not agree on peer reads"
        assert writable is writes_agreed, f"rank {r.rank}: writes agreed {writable}"
        assert moved == (["read", "write"] if writes_agreed else ["read"]), moved
        assert wrong == [], f"rank {r.rank}: {wrong}"
        assert digests == results[0].value[1], f"rank {r.rank} differs from rank 0"


def peer_read_broadcasts(rank, p, store):
    """Large broadcasts from every root, by the public call at p = 2 (which reads the root
    from BROADCAST_MIN_BYTES on) and by peer reads themselves at p = 3: returns the roots whose
    bytes did not arrive."""
    t = shm.create(rank, p, store, 30.0)
    calls, wrong = Calls(), []
    try:
        n = (single_copy.BROADCAST_MIN_BYTES[2] >> 3) + 3
        for root in range(p):
            data = np.random.default_rng([root, n]).standard_normal(n)
            buf = data.copy() if rank == root else np.full(n, -1.0)
            if rank == root:
                buf.flags.writeable = False  # the root's buffer is only read
            fp = calls.fp(f"broadcast:{root}", buf)
            if p == 2:
                t.collectives.broadcast(buf, root, fp)
            else:
                single_copy.broadcast(t.collectives, buf.view(np.uint8), root, fp)
            if buf.tobytes() != data.tobytes():
                wrong.append(root)
        return wrong
    finally:
        t.close()


@needs_peer_reads
@pytest.mark.parametrize("p", [2, 3])
def test_peer_read_broadcast_from_every_root(tmp_path, p):
    results = run_ranks(p, peer_read_broadcasts, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    assert all(r.value == [] for r in results), [r.value for r in results]


def switched(rank, p, store, off_ranks):
    """``NEURAL_ARCH_SHM_PEER_READ=0`` on ``off_ranks``: a large all-reduce must take the
    workspace path on every rank (the peer-read one is replaced by an error here)."""
    if rank in off_ranks:
        os.environ[cross_memory.ENV_SWITCH] = "0"

    def refuse(*args):
        raise AssertionError("peer reads used although switched off")
    single_copy.all_reduce = refuse
    t = shm.create(rank, p, store, 30.0)
    try:
        inputs = _inputs(p, PAIR_N, np.float32, ReduceOp.SUM)
        buf = inputs[rank].copy()
        t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        try:
            direct.all_reduce(t.collectives, buf.copy(), ReduceOp.SUM,
                              Calls().fp("all_reduce", buf), CHUNK)
            explicit = "no error"
        except ValueError as exc:
            explicit = str(exc)
        same = buf.tobytes() == rank_order_reduction(inputs, ReduceOp.SUM).tobytes()
        return t.peer_reads.usable, same, explicit
    finally:
        t.close()


@pytest.mark.parametrize("off_ranks", [(0, 1), (1,)])
def test_switched_off_on_any_rank_every_rank_takes_the_workspace_path(tmp_path, off_ranks):
    results = run_ranks(2, switched, off_ranks, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        usable, same, explicit = r.value
        assert usable is False and same is True, r.value
        assert cross_memory.ENV_SWITCH in explicit, explicit


def test_an_unknown_switch_value_is_refused_naming_it(tmp_path, monkeypatch):
    monkeypatch.setenv(cross_memory.ENV_SWITCH, "sometimes")
    with pytest.raises(ValueError, match=f"{cross_memory.ENV_SWITCH}='sometimes'"):
        shm.create(0, 1, DirStore(str(tmp_path)), 5.0)


def mismatched_large(rank, p, store, kind):
    t = shm.create(rank, p, store, 10.0)
    try:
        n = PAIR_N + (1 if kind == "count" and rank == 1 else 0)
        buf = np.ones(n, np.float32)
        if kind == "op" and rank == 1:
            t.collectives.broadcast(buf, 0, Calls().fp("broadcast", buf))
        else:
            t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        return "no error"
    finally:
        t.close()


@needs_peer_reads
@pytest.mark.parametrize("kind,names", [("count", (f"{PAIR_N} x float32",
                                                   f"{PAIR_N + 1} x float32")),
                                        ("op", ("all_reduce", "broadcast"))])
def test_mismatched_large_calls_still_raise_naming_both(tmp_path, kind, names):
    results = run_ranks(2, mismatched_large, kind, store_dir=str(tmp_path), timeout=40)
    for r in results:
        assert r.error == CollectiveMismatchError.__name__, r
        assert names[0] in r.message and names[1] in r.message, r.message


def dies_mid_call(rank, p, store):
    """Rank 1 dies at its first read of a large all-reduce; rank 0 reads rank 1's buffer only
    once rank 1 is gone, so the read itself must fail (not a wait) and name rank 1."""
    t = shm.create(rank, p, store, 20.0)
    reads = t.peer_reads
    real_read = reads.read
    try:
        buf = np.ones(PAIR_N, np.float32)
        t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        if rank == 1:
            reads.read = lambda *args: kill_self()
        else:
            def read_after_death(*args):
                deadline = time.monotonic() + 10.0
                while pid_alive(reads.pids[1]) and time.monotonic() < deadline:
                    time.sleep(0.005)
                real_read(*args)
            reads.read = read_after_death
        try:
            t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        except PeerFailureError as e:  # what failed, and whether the buffer was kept alive
            return e.peer, str(e), [b is buf for b in reads.kept], reads.writable
        return "no error"
    finally:
        t.close()


@needs_peer_reads
def test_a_peer_dying_mid_call_fails_the_read_naming_it(tmp_path):
    results = run_ranks(2, dies_mid_call, store_dir=str(tmp_path), timeout=40)
    assert results[1].exitcode == -9
    assert results[0].ok, results[0]
    peer, message, kept, writable = results[0].value
    assert peer == 1 and "peer rank 1" in message and "all_reduce" in message
    assert "ESRCH" in message, message
    # a peer may still write into a buffer whose call failed: it outlives the call
    assert kept == ([True] if writable else []), kept


@needs_peer_reads
def test_a_read_of_an_unmapped_address_raises_naming_the_peer():
    with contextlib.closing(cross_memory.PeerReads(0, 2)) as reads:
        reads.pids = [os.getpid()] * 2
        with pytest.raises(PeerFailureError, match=r"peer rank 1.*EFAULT") as info:
            reads.read(1, 8, np.zeros(16, np.uint8), "all_reduce", 7)
    assert "all_reduce #7" in str(info.value) and info.value.peer == 1


@needs_peer_reads
def test_a_read_larger_than_one_system_call_moves_goes_in_pieces(monkeypatch):
    # one process_vm_readv moves at most ~2 GiB and returns a partial count for more: a
    # system call capped at 1000 bytes stands in for the kernel, pieces of 1000 for the code's
    monkeypatch.setattr(cross_memory, "MAX_READ_BYTES", 1000)
    reads = cross_memory.PeerReads(0, 2)
    reads.pids = [os.getpid()] * 2
    whole_call, sizes = reads._call, []

    def capped(pid, local, n_local, remote, n_remote, flags):
        sizes.append(local._obj.len)
        local._obj.len = remote._obj.len = min(local._obj.len, 1000)
        return whole_call(pid, local, n_local, remote, n_remote, flags)
    monkeypatch.setattr(reads, "_call", capped)
    source = np.arange(4099, dtype=np.uint8)
    out = np.zeros_like(source)
    try:
        reads.read(1, source.ctypes.data, out, "broadcast", 3)
    finally:
        reads.close()
    np.testing.assert_array_equal(out, source)
    assert sizes == [1000, 1000, 1000, 1000, 99], sizes


def test_peer_read_rows_count_only_where_the_ranks_agreed(monkeypatch, tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"format": 1, "all_reduce": {"2": [{"up_to_bytes": 1048576, '
                    '"algorithm": "peer_read", "round_bytes": 262144}]}}')
    monkeypatch.setenv(tuning.ENV_TABLE, str(path))
    tuning.forget()
    try:
        assert tuning.all_reduce_choice(2, 1 << 20, 4096, True) == Choice("peer_read", 256 << 10)
        assert tuning.all_reduce_choice(2, 1 << 20, 4096, False) == Choice("whole", 4096)
    finally:
        tuning.forget()
    small, large = tuning.PEER_READ_MIN_BYTES[2] - 1, tuning.PEER_READ_MIN_BYTES[2]
    assert tuning.default_choice(2, large, True).algorithm == "peer_read"
    assert tuning.default_choice(2, small, True).algorithm == "whole"
    assert tuning.default_choice(2, large, False).algorithm == "whole"
    assert tuning.default_choice(4, 64 << 20, True).algorithm == "split"  # not measured faster


@pytest.mark.parametrize("flag", ["true", "false", None])
def test_peer_read_rows_of_a_table_measured_with_writes_need_writes(monkeypatch, tmp_path, flag):
    path = tmp_path / "t.json"
    field = f'"{tuning.PEER_WRITES}": {flag}, ' if flag else ""
    path.write_text('{"format": 1, ' + field + '"all_reduce": {"2": [{"up_to_bytes": 1048576, '
                    '"algorithm": "peer_read", "round_bytes": 262144}]}}')
    monkeypatch.setenv(tuning.ENV_TABLE, str(path))
    tuning.forget()
    try:
        row, default = Choice("peer_read", 256 << 10), Choice("whole", 4096)
        assert tuning.all_reduce_choice(2, 1 << 20, 4096, tuning.READ_WRITE) == row
        assert tuning.all_reduce_choice(2, 1 << 20, 4096, tuning.READ) == \
            (default if flag == "true" else row)
        assert tuning.all_reduce_choice(2, 1 << 20, 4096, tuning.NO_PEER_MEMORY) == default
    finally:
        tuning.forget()


def test_a_table_whose_peer_writes_field_is_not_a_bool_is_refused(monkeypatch, tmp_path):
    path = tmp_path / "t.json"
    path.write_text(f'{{"format": 1, "{tuning.PEER_WRITES}": "yes", "all_reduce": {{}}}}')
    monkeypatch.setenv(tuning.ENV_TABLE, str(path))
    tuning.forget()
    try:
        with pytest.raises(ValueError, match=f'"{tuning.PEER_WRITES}" must be true or false, '
                                             "got 'yes'"):
            tuning.all_reduce_choice(2, 1 << 20, 4096, tuning.READ_WRITE)
    finally:
        tuning.forget()
