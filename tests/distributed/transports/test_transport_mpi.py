"""MPI transport under a real mpiexec, its native collectives, and same-host death detection."""
import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from mpiexec_launch import run_until_launched
from neural_arch.distributed.transports import mpi as mpi_transport
from repo_paths import REPO_ROOT as REPO

pytestmark = pytest.mark.timeout(180)
HAVE_MPI = importlib.util.find_spec("mpi4py") is not None and shutil.which("mpiexec") is not None
needs_mpi = pytest.mark.skipif(not HAVE_MPI, reason="mpi4py or mpiexec not installed")

EXCHANGE = textwrap.dedent("""
    import numpy as np
    from neural_arch.distributed.errors import (CollectiveMismatchError, CollectiveTimeoutError,
                                                PeerFailureError)
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports import mpi, mpi_wire
    from neural_arch.distributed.transports.base import Fingerprint

    def wire_and_size_mismatches(rank):
        # A small payload travels in one MPI message with its header; a message of another
        # size than the receiver expects (either side small or large, or not one of ours) is a
        # mismatch naming both calls, never a truncation or a hang.
        import time
        from mpi4py import MPI
        from neural_arch.distributed.transports.base import HEADER_SIZE, unpack_header
        small, large = Fingerprint("all_reduce", 11, "float32", 4), \
            Fingerprint("all_reduce", 11, "float32", 300000)
        one, two = mpi.create(timeout=60), mpi.create(timeout=60)
        if rank == 0:
            one.send(np.arange(4, dtype=np.float32), 1, small)  # expected large
            one.send(np.arange(4, dtype=np.float32), 1, small)  # read by hand
            try:
                two.recv(np.zeros(4, np.float32), 1, small)
                raise AssertionError("size mismatch not detected")
            except CollectiveMismatchError as e:
                assert "expected all_reduce #11 (group 0, 4 x float32)" in str(e) and \
                    "sent all_reduce #11 (group 0, 300000 x float32)" in str(e), e
                assert (e.rank, e.peer) == (0, 1)
            two.comm.Recv([np.empty(300000, np.float32), MPI.BYTE], 1, mpi_wire.TAG)  # the rest
            try:
                one.recv(np.zeros(4, np.float32), 1, small)
                raise AssertionError("malformed message not detected")
            except CollectiveMismatchError as e:
                assert "peer rank 1 sent a malformed header" in str(e), e
        elif rank == 1:
            try:
                one.recv(np.zeros(300000, np.float32), 0, large)
                raise AssertionError("size mismatch not detected")
            except CollectiveMismatchError as e:
                assert "expected all_reduce #11 (group 0, 300000 x float32)" in str(e) and \
                    "sent all_reduce #11 (group 0, 4 x float32)" in str(e), e
                assert (e.rank, e.peer) == (1, 0)
            status, deadline = MPI.Status(), time.monotonic() + 30
            while not one.comm.Iprobe(0, mpi_wire.TAG, status):
                assert time.monotonic() < deadline, "no message"
            raw = bytearray(status.Get_count(MPI.BYTE))
            assert len(raw) == HEADER_SIZE + 16, f"{len(raw)} bytes in the first message"
            one.comm.Recv([raw, MPI.BYTE], 0, mpi_wire.TAG)
            assert unpack_header(bytes(raw[:HEADER_SIZE])) == (small, 16)
            assert np.array_equal(np.frombuffer(raw, np.float32, offset=HEADER_SIZE),
                                  np.arange(4))
            two.send(np.ones(300000, np.float32), 0, large)
            one.comm.Send([bytearray(3), MPI.BYTE], 0, mpi_wire.TAG)
        one.close()
        two.close()

    def large_payloads_of_other_sizes(rank):
        # Both payloads large, of other sizes: each rank names both calls from the header,
        # never an MPI truncation error (Open MPI's single-copy transfer of a payload larger
        # than its receive corrupts the receiving process's memory: a payload's receive is
        # posted only once its header matched).
        three = mpi.create(timeout=60)
        if rank in (0, 1):
            n, other = (300000, 200000) if rank == 0 else (200000, 300000)
            got = np.zeros(n, np.float32)
            try:
                three.sendrecv(np.ones(n, np.float32), 1 - rank, got, 1 - rank,
                               Fingerprint("all_reduce", 15, "float32", n))
                raise AssertionError("size mismatch not detected")
            except CollectiveMismatchError as e:
                assert f"expected all_reduce #15 (group 0, {n} x float32)" in str(e) and \
                    f"sent all_reduce #15 (group 0, {other} x float32)" in str(e), e
            assert not got.any(), "a payload landed before its header was checked"
            from mpi4py import MPI
            stray = np.zeros(other, np.float32)  # the peer's payload, never received: by hand
            three.comm.Recv([stray, MPI.BYTE], 1 - rank, mpi_wire.TAG)
            assert (stray == 1).all()
            try:  # the stream is out of step: refused at once, naming why
                three.send(np.ones(4, np.float32), 1 - rank,
                           Fingerprint("all_reduce", 16, "float32", 4))
                raise AssertionError("an out-of-step stream was used")
            except PeerFailureError as e:
                assert "mismatched header in all_reduce #15" in str(e), e
        three.close()

    def swap_on_the_wire(rank, one, two):
        # A two-rank swap is one MPI message each way, the header packed before the payload,
        # received into a buffer kept per peer; a message of the other form (a header alone,
        # or a packed one where a plain receive expects a header) is named, never truncated.
        from mpi4py import MPI
        from neural_arch.distributed.transports.base import HEADER_SIZE, pack_header, \
            unpack_header
        if one.world_size != 2:
            return  # only two ranks swap more than a packed message (buffers are sized so)
        fps = [Fingerprint("all_reduce", seq, "float32", 16384) for seq in (12, 13, 14)]
        mine = payload(rank, 16384, "float32")
        if rank in (0, 1):
            peer, got = 1 - rank, []
            for _ in range(2):
                one.swap(mine, peer, fps[0], lambda theirs: got.append(theirs.copy()))
                kept = one.first_buffers.take(peer)  # the one buffer both swaps received into
                one.first_buffers.give(peer, kept)
                got.append(kept)
            assert np.array_equal(got[0], payload(peer, 16384, "float32"))
            assert got[1] is got[3] and np.array_equal(got[2], got[0])
        if rank == 0:
            try:
                one.swap(mine, 1, fps[1], lambda theirs: None)
                raise AssertionError("a header alone was taken for a swap")
            except CollectiveMismatchError as e:
                assert "sent a header alone for all_reduce #13" in str(e) and \
                    "where a packed swap of 65536 bytes was expected" in str(e), e
            try:
                two.recv(np.empty(16384, np.float32), 1, fps[2])
                raise AssertionError("a swap's message was taken for a header")
            except CollectiveMismatchError as e:
                assert "sent a packed swap of 65536 bytes for all_reduce #14" in str(e) and \
                    "where a header alone was expected" in str(e), e
            two.comm.Send([bytearray(3), MPI.BYTE], 1, mpi_wire.TAG)
        elif rank == 1:
            raw = bytearray(HEADER_SIZE + 65536)
            one.comm.Recv([raw, MPI.BYTE], 0, mpi_wire.TAG)  # the whole swap, in one message
            assert unpack_header(bytes(raw[:HEADER_SIZE])) == (fps[1], 65536)
            assert np.array_equal(np.frombuffer(raw, np.float32, offset=HEADER_SIZE), mine * 0 +
                                  payload(0, 16384, "float32"))
            one.comm.Send([bytearray(pack_header(fps[1], 65536)), MPI.BYTE], 0, mpi_wire.TAG)
            try:
                two.swap(mine, 0, fps[2], lambda theirs: None)
                raise AssertionError("malformed message not detected")
            except CollectiveMismatchError as e:
                assert "peer rank 0 sent a malformed header" in str(e), e

    def later_transport_after_staggered_close(rank, world, barrier):
        # Rank 0 closes first, its peers only once it has freed its communicator: their
        # notices that they left come too late for it, and MPI reuses a freed communicator's
        # context. The next transport must see neither a peer that left nor a lost message.
        from mpi4py import MPI
        from neural_arch.distributed import algorithms
        from neural_arch.distributed.reduce_ops import ReduceOp
        from neural_arch.distributed.transports import mpi_notices
        old = mpi.create(timeout=10)
        kept, got = old.comm, np.empty(4)
        old.sendrecv(np.full(4, float(rank)), (rank + 1) % world, got, (rank - 1) % world,
                     Fingerprint("ring", 0, "float64", 4))
        if rank == 0:
            waited, mpi_notices.CLOSE_WAIT_S = mpi_notices.CLOSE_WAIT_S, 0.1  # they will not come
            old.close()
            mpi_notices.CLOSE_WAIT_S = waited
        barrier()
        if rank != 0:
            old.close()
        new = mpi.create(timeout=2)
        n = 8192  # 64 KiB of float64
        got = np.zeros(n)
        new.sendrecv(payload(rank, n, "float64"), (rank + 1) % world, got, (rank - 1) % world,
                     Fingerprint("ring", 0, "float64", n))
        assert np.array_equal(got, payload((rank - 1) % world, n, "float64"))
        summed = payload(rank, n, "float64")
        algorithms.all_reduce(new, summed, ReduceOp.SUM, Fingerprint("all_reduce", 1, "float64", n))
        assert np.allclose(summed, sum(payload(r, n, "float64") for r in range(world)),
                           rtol=1e-12)
        algorithms.barrier(new, Fingerprint("barrier", 2, "uint8", 0))
        new.close()
        # Rank 0's peers had not left within its close: it keeps its communicator, whose
        # late notices then reach no later one; at p = 2 its peer had heard it leave, and frees.
        if rank == 0:
            assert kept != MPI.COMM_NULL, "rank 0 freed a communicator its peers still used"
        elif world == 2:
            assert kept == MPI.COMM_NULL, "rank 1 kept a communicator every peer had left"

    def payload(rank, n, dtype):
        rng = np.random.default_rng(1000 * rank + n)
        if np.dtype(dtype).kind == "i":
            return rng.integers(-1000, 1000, n).astype(dtype)
        return rng.standard_normal(n).astype(dtype)

    t = mpi.create(timeout=60)
    swapping = [mpi.create(timeout=60) for _ in range(2)]  # for swap_on_the_wire
    rank, world = t.rank, t.world_size
    right, left = (rank + 1) % world, (rank - 1) % world
    for seq, (n, dtype) in enumerate([(0, "float64"), (1, "float64"), (7, "float32"),
                                      (33, "float16"), (12345, "int32"), (1000003, "float64")]):
        got = np.full(n, 99, dtype)
        t.sendrecv(payload(rank, n, dtype), right, got, left, Fingerprint("ring", seq, dtype, n))
        assert np.array_equal(got, payload(left, n, dtype)), (n, dtype)
    for peer in range(1, world):  # plain send/recv, rank 0 with each peer in turn
        fp = Fingerprint("p2p", peer, "float64", 1000)
        if rank == 0:
            t.send(payload(0, 1000, "float64"), peer, fp)
            back = np.empty(1000)
            t.recv(back, peer, fp)
            assert np.array_equal(back, payload(peer, 1000, "float64"))
        elif rank == peer:
            got = np.empty(1000)
            t.recv(got, 0, fp)
            assert np.array_equal(got, payload(0, 1000, "float64"))
            t.send(payload(peer, 1000, "float64"), 0, fp)

    native = t.native_collectives()
    everyone = [payload(r, 1001, "float64") for r in range(world)]
    for op, reference in [("sum", np.sum), ("average", np.mean), ("max", np.max),
                          ("min", np.min), ("product", np.prod)]:
        buf = everyone[rank].copy()
        native.all_reduce(buf, ReduceOp[op.upper()])
        assert np.allclose(buf, reference(np.stack(everyone), axis=0), rtol=1e-12), op
    ints = payload(rank, 100, "int32")
    native.all_reduce(ints, "sum")
    assert np.array_equal(ints, sum(payload(r, 100, "int32") for r in range(world)))
    gathered = np.empty(world * 1001)
    native.all_gather(everyone[rank], gathered)
    assert np.array_equal(gathered, np.concatenate(everyone))
    root_data = everyone[world - 1].copy() if rank == world - 1 else np.zeros(1001)
    native.broadcast(root_data, world - 1)
    assert np.array_equal(root_data, everyone[world - 1])
    chunks = np.empty(4)
    native.reduce_scatter(payload(rank, 4 * world, "float64"), chunks)
    total = sum(payload(r, 4 * world, "float64") for r in range(world))
    assert np.allclose(chunks, total[4 * rank:4 * rank + 4], rtol=1e-12)
    native.barrier()

    if rank == 0:
        t.send(np.zeros(4, np.float32), 1, Fingerprint("all_reduce", 9, "float32", 4))
    elif rank == 1:
        try:
            t.recv(np.zeros(4, np.float32), 0, Fingerprint("broadcast", 9, "float32", 4))
            raise AssertionError("mismatch not detected")
        except CollectiveMismatchError as e:
            assert "expected broadcast #9" in str(e) and "sent all_reduce #9" in str(e), e
            assert (e.rank, e.peer) == (1, 0)
    native.barrier()
    wire_and_size_mismatches(rank)
    native.barrier()
    large_payloads_of_other_sizes(rank)
    native.barrier()
    swap_on_the_wire(rank, *swapping)
    native.barrier()
    later_transport_after_staggered_close(rank, world, native.barrier)
    for each in swapping:
        each.close()
    short = mpi.create(timeout=0.5)
    if rank == 0:
        try:
            short.recv(np.zeros(2), 1, Fingerprint("reduce", 5, "float64", 2))
            raise AssertionError("no timeout")
        except CollectiveTimeoutError as e:
            assert (e.peer, e.op, e.seq) == (1, "reduce", 5) and "0.5 s" in str(e), e
    native.barrier()
    short.close()
    t.close()
    t.close()
    print(f"EXCHANGE-OK rank {rank} of {world}", flush=True)
""")

DEATH = textwrap.dedent("""
    import os, signal, sys, time
    import numpy as np
    from neural_arch.distributed.errors import PeerFailureError
    from neural_arch.distributed.transports import mpi, mpi_wire
    from neural_arch.distributed.transports.base import Fingerprint

    t = mpi.create(timeout=10)  # detection must beat this, or the error is a timeout
    rank, world = t.rank, t.world_size
    t.native_collectives().barrier()
    if rank == world - 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    try:
        t.recv(np.zeros(8), world - 1, Fingerprint("broadcast", 3, "float64", 8))
    except PeerFailureError as e:
        print(f"DEATH-SEEN rank {rank} peer {e.peer} op {e.op} seq {e.seq}", flush=True)
    # stay until every survivor has reported (each leaves a file in the job's folder)
    open(f"reported{rank}", "w").close()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not all(
            os.path.exists(f"reported{r}") for r in range(world - 1)):
        time.sleep(0.02)
    # MPI_Finalize with a dead peer may wait on it for ever, even under --enable-recovery.
    os._exit(0)
""")


def _mpiexec(tmp_path, script, ranks, extra=(), timeout=150):
    path = tmp_path / "job.py"
    path.write_text(script)
    # Shared-memory backing files go under tmp_path: a killed rank cannot strand them in /dev/shm.
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_rmaps_base_oversubscribe="1",
               OMPI_MCA_btl_sm_backing_directory=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    cmd = ["mpiexec", "-n", str(ranks), "--oversubscribe", *extra, sys.executable, str(path)]

    def run_once():
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, cwd=tmp_path, start_new_session=True)
        try:
            output, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired as e:  # the caller judges what was printed: SIGKILL
            output = e.output.decode() if isinstance(e.output, bytes) else (e.output or "")
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
        return proc.returncode, output
    return run_until_launched(run_once, output_of=lambda result: result[1])


@needs_mpi
@pytest.mark.parametrize("ranks", [2, 4])
def test_exchange_and_native_collectives_under_mpiexec(tmp_path, ranks):
    code, output = _mpiexec(tmp_path, EXCHANGE, ranks)
    assert code == 0, output
    assert sorted(line for line in output.splitlines() if line.startswith("EXCHANGE-OK")) == \
        [f"EXCHANGE-OK rank {r} of {ranks}" for r in range(ranks)]


def _open_mpi_5():
    try:
        version = subprocess.run(["mpiexec", "--version"], capture_output=True, text=True,
                                 timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "Open MPI" in version and any(f"Open MPI) {v}." in version for v in "56789")


@needs_mpi
def test_same_host_peer_death_is_reported(tmp_path):
    if not _open_mpi_5():
        pytest.skip("needs Open MPI 5's --enable-recovery to keep survivors alive")
    # What is checked is what the survivors print, not how mpiexec tears down after a death.
    _, output = _mpiexec(tmp_path, DEATH, 3, extra=("--enable-recovery",), timeout=60)
    seen = sorted(line for line in output.splitlines() if line.startswith("DEATH-SEEN"))
    assert seen == [f"DEATH-SEEN rank {r} peer 2 op broadcast seq 3" for r in (0, 1)], output


def test_missing_mpi4py_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(ImportError, match="pip install mpi4py"):
        mpi_transport.create()
