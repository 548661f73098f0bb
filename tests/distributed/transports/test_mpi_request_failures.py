"""How the MPI transport fails when MPI fails a request, or a wait gives up before its first poll,
on a fake MPI (no mpiexec needed).

Under ``mpiexec --with-ft ulfm`` a dead peer's error may come from the very first MPI call of a
message (a send's or a receive's post, a collective's, the first test, a wait's first probe for
notices): it must still become PeerFailureError naming the rank MPI reports failed, with the
requests already posted cancelled, the peer marked unusable and the job marked broken (so that
exit does not wait in ``MPI_Finalize``). A request posted before a wait that gives up is
cancelled, and kept alive with its buffers: MPI may still touch them. A notice that cannot be
sent is dropped: a rank's close never raises for it; one whose Test fails keeps its buffer.
"""
from types import SimpleNamespace

import fake_mpi
import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.health import heartbeat, mpi_heartbeat
from neural_arch.distributed.rendezvous import store
from neural_arch.distributed.transports import (mpi, mpi_exit, mpi_notices, mpi_waiting,
                                                mpi_wire)
from neural_arch.distributed.transports.base import HEADER_SIZE, Fingerprint, pack_header

pytestmark = pytest.mark.timeout(30)
FP = fake_mpi.FP


@pytest.fixture
def transport(monkeypatch):
    monkeypatch.setattr(mpi, "_import_mpi", fake_mpi.module)
    monkeypatch.setattr(mpi_exit, "_broken", None)  # what a failure marks, undone after

    def make(fail_at=None, world_size=2):
        return mpi.create(timeout=5, comm=fake_mpi.Comm(world_size, fail_at))
    return make


CALLS = {
    "recv": lambda t: t.recv(np.zeros(4, np.float32), 1, FP),
    "sendrecv": lambda t: t.sendrecv(np.ones(4, np.float32), 1, np.zeros(4, np.float32), 1, FP),
    "swap": lambda t: t.swap(np.ones(4, np.float32), 1, FP, lambda got: None),
    "send_recv_many": lambda t: t.send_recv_many([(np.ones(4, np.float32), 1, FP)],
                                                 [(np.zeros(4, np.float32), 1, FP)]),
}
LARGE = 4096  # float32 elements: past a packed message, so a header and a payload are sent
# Calls that post two sends or more: the second fails at its post (``fail_at="Isend"``).
SENDING_CALLS = {
    "send": lambda t: t.send(np.ones(LARGE, np.float32), 1, FP),
    "sendrecv": lambda t: t.sendrecv(np.ones(LARGE, np.float32), 1,
                                     np.zeros(LARGE, np.float32), 1, FP),
    "send_recv_many": lambda t: t.send_recv_many(
        [(np.ones(4, np.float32), 1, FP)] * 2, [(np.zeros(4, np.float32), 1, FP)]),
    "send_recv_chained": lambda t: t.send_recv_chained(
        [(np.ones(4, np.float32), 1, FP)], [(np.zeros(4, np.float32), 1, FP, None)]),
    "native barrier": lambda t: t.native_collectives().barrier(),
    "a wait's first look": lambda t: CALLS["recv"](t),  # fails at its notices' probe
}


def _kept(abandoned: list) -> list:
    """Everything ``abandoned`` holds, through lists, tuples, dicts and incoming messages."""
    found, todo = [], list(abandoned)
    while todo:
        entry = todo.pop()
        found.append(entry)
        if isinstance(entry, (list, tuple)):
            todo += entry
        elif isinstance(entry, dict):
            todo += entry.values()
        elif isinstance(entry, mpi_wire.Incoming):
            todo += entry.reqs
    return found


@pytest.mark.parametrize("fail_at", ["Irecv", "Test"])
@pytest.mark.parametrize("call", sorted(CALLS))
def test_an_mpi_error_at_the_first_call_names_the_failed_peer(transport, call, fail_at):
    t = transport(fail_at)
    with pytest.raises(PeerFailureError, match=r"MPI reports rank\(s\) \[1\] failed during "
                                               r"all_reduce #7") as info:
        CALLS[call](t)
    assert (info.value.rank, info.value.peer, info.value.op) == (0, 1, "all_reduce")
    assert 1 in t._unusable and mpi_exit._broken is not None
    assert all(req.cancelled for req in t.comm.posted), f"{call}: a request left posted"
    kept = _kept(t.abandoned)  # MPI may still touch a cancelled request's buffers
    assert all(any(req is k for k in kept) for req in t.comm.posted), f"{call}: a request let go"


@pytest.mark.parametrize("call", sorted(SENDING_CALLS))
def test_an_mpi_error_at_a_post_names_the_failed_peer(transport, call):
    fail_at = {"native barrier": "Ibarrier", "a wait's first look": "Iprobe"}.get(call, "Isend")
    t = transport()
    t.comm.fail_at, t._next_check = fail_at, 0.0  # the wait's first look is due at once
    with pytest.raises(PeerFailureError, match=r"MPI reports rank\(s\) \[1\] failed during "
                                               r"(all_reduce #7|mpi.barrier #1)") as info:
        SENDING_CALLS[call](t)
    assert (info.value.rank, info.value.peer) == (0, 1)
    assert 1 in t._unusable and mpi_exit._broken is not None
    assert all(req.cancelled for req in t.comm.posted), f"{call}: a request left posted"
    kept = _kept(t.abandoned)  # MPI may still touch a cancelled request's buffers
    assert all(any(req is k for k in kept) for req in t.comm.posted), f"{call}: a request let go"


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_notice_that_cannot_be_sent_leaves_close_quiet(transport, monkeypatch, world_size):
    monkeypatch.setattr(mpi_notices, "CLOSE_WAIT_S", 0.05)  # no peer's notice comes here
    t = transport(world_size=world_size)
    comm = t.comm
    comm.fail_at = "Isend"
    t.publish_failure(1, "found dead")  # the first notice is posted, every later one fails
    t.close()
    assert t.comm is None and len(comm.posted) == 1
    assert "could not be sent" in mpi_exit._broken  # finalizing might wait for a dead peer


def test_a_give_up_at_the_first_look_cancels_the_posted_receive(transport, monkeypatch):
    t = transport()
    monkeypatch.setattr(mpi_waiting, "process_alive", lambda pid, start: False)
    t._next_check = 0.0  # the look is due at once
    with pytest.raises(PeerFailureError, match=r"peer rank\(s\) \[1\] on this host"):
        CALLS["sendrecv"](t)
    receives = [req for req in t.comm.posted if req.buf is not None]
    assert len(receives) == 1 and receives[0].cancelled, "a receive left posted"
    kept = [getattr(entry, "first", None) for entry in t.abandoned]
    assert any(buf is receives[0].buf for buf in kept), "a receive's buffer was let go"


def test_the_heartbeat_invitation_waits_under_the_transports_lock(transport):
    t = transport()
    fp = Fingerprint("mpi.heartbeat_store", 0, "uint8", 0)
    assert mpi_heartbeat._broadcast_bytes(t, b"invitation", fp) == b"invitation"
    with pytest.raises(RuntimeError, match="without holding the transport's lock"):
        t.wait_requests([t.comm.Ibcast(np.zeros(1), 0)], fp)


def test_an_mpi_error_at_the_setup_exchange_names_the_failed_peer(transport):
    with pytest.raises(PeerFailureError, match=r"MPI reports rank\(s\) \[1\] failed during "
                                               r"mpi.setup #0 .*\(MPI_ERR_PROC_FAILED") as info:
        transport("Iallgather")
    assert (info.value.rank, info.value.peer, info.value.op) == (0, 1, "mpi.setup")
    assert mpi_exit._broken is not None  # finalizing would wait for the failed rank


class _HeartbeatStore:
    """Rank 0's heartbeat store, without a socket."""
    port, served = 1, []

    def __init__(self, *args, **kwargs):
        self.closed = False
        self.served.append(self)

    def close(self):
        self.closed = True


@pytest.mark.parametrize("fail_at", ["Ibcast", "Iallgather"])
def test_an_mpi_error_at_a_heartbeat_post_names_the_failed_peer(transport, monkeypatch,
                                                                fail_at):
    monkeypatch.setattr(store, "TCPStore", _HeartbeatStore)
    monkeypatch.setattr(_HeartbeatStore, "served", [])
    monkeypatch.delenv(heartbeat.ENABLE_ENV, raising=False)
    t = transport()
    t.comm.fail_at = fail_at
    with pytest.raises(PeerFailureError, match=r"MPI reports rank\(s\) \[1\] failed during "
                                               r"mpi.heartbeat_store #0") as info:
        mpi_heartbeat.heartbeat_store(t, 5.0, mode="store")
    assert (info.value.rank, info.value.peer) == (0, 1)
    assert 1 in t._unusable and mpi_exit._broken is not None
    assert not t.lock.locked()
    assert [served.closed for served in _HeartbeatStore.served] == [True]  # no server left


@pytest.mark.parametrize("world_size, first_bytes", [
    (2, mpi_wire.HEADER_SIZE + mpi_wire.SWAP_MAX_BYTES),
    (4, mpi_wire.HEADER_SIZE + mpi_wire.PACKED_MAX_BYTES)])
def test_first_buffers_hold_a_swap_only_where_one_runs(transport, world_size, first_bytes):
    t = transport(world_size=world_size)
    assert len(t.first_buffers.take(1)) == len(t.send_buffers.take(1)) == first_bytes
    if world_size != 2:
        with pytest.raises(ValueError, match=r"swap takes at most 8192 bytes at 4 ranks"):
            t.swap(np.ones(4096, np.float32), 1, FP, lambda got: None)


def _mismatch(count: int, packed: bool) -> str:
    fp = Fingerprint("all_reduce", 13, "float32", 16384)
    first = bytearray(pack_header(fp, 65536)) + bytearray(count - HEADER_SIZE)
    t = SimpleNamespace(rank=0, mark_unusable=lambda peer, why: None)
    with pytest.raises(CollectiveMismatchError) as info:
        mpi_wire.check_first(t, first, count, 1, fp, 65536, packed)
    return str(info.value)


def test_a_swap_against_a_plain_message_names_both_forms():
    assert "peer rank 1 sent a header alone for all_reduce #13" in _mismatch(HEADER_SIZE, True)
    assert "where a packed swap of 65536 bytes was expected" in _mismatch(HEADER_SIZE, True)
    assert "sent a packed swap of 65536 bytes for all_reduce #13" in \
        _mismatch(HEADER_SIZE + 65536, False)
    assert "where a header alone was expected" in _mismatch(HEADER_SIZE + 65536, False)
    assert "sent a 100-byte message" in _mismatch(100, True)  # neither form: not ours


def test_a_notice_whose_test_fails_keeps_its_buffer(transport, monkeypatch):
    """A notice's send whose ``Test`` raises may still be active: MPI could read its bytes
    later, so the request and its buffer stay referenced for the transport's life."""
    monkeypatch.setattr(mpi_notices, "CLOSE_WAIT_S", 0.05)  # no peer's notice comes here
    t = transport()
    notices = []

    def failing_isend(buf, dst, tag):
        notices.append(fake_mpi.Request(True, buf=buf[0]))
        return notices[-1]
    monkeypatch.setattr(t.comm, "Isend", failing_isend)
    t.publish_failure(1, "found dead")
    t.close()  # the "I am leaving" notice's Test fails too
    assert len(notices) == 2
    kept = _kept(t.abandoned)  # the notices live as long as the transport
    for notice in notices:
        assert any(notice is k for k in kept), "a notice's request was let go"
        assert any(notice.buf is k for k in kept), "a notice's buffer was let go"


STRIDED = np.ones(8, np.float32)[::2]  # not C-contiguous: no byte view of it can be sent


def test_a_chained_call_checks_every_send_buffer_before_posting(transport):
    t = transport()
    with pytest.raises(ValueError, match=r"send buffer must be C-contiguous; got shape \(4,\)"):
        t.send_recv_chained([(np.ones(4, np.float32), 1, FP), (STRIDED, 1, FP)],
                            [(np.zeros(4, np.float32), 1, FP, None)])
    assert t.comm.posted == [], "a plan or a send was posted before a bad buffer was found"
    assert 1 not in t._unusable  # nothing reached the peer: its stream is still in step


def test_a_bad_follow_up_buffer_leaves_the_peer_unusable(transport):
    """A follow-up's buffer is known only once its receive completed, after the plans went
    out: the peer waits for a piece that will not come, so its stream is out of step."""
    t = transport()
    t._comm = fake_mpi.ChainedPeer()
    with pytest.raises(ValueError, match="send buffer must be C-contiguous"):
        t.send_recv_chained([], [(np.zeros(4, np.float32), 1, FP, lambda: [(STRIDED, 1, FP)])])
    with pytest.raises(PeerFailureError, match=r"connection unusable: a follow-up of all_reduce "
                                               r"#7 .* failed after the plans were sent "
                                               r"\(ValueError: send buffer must be C-contig"):
        t.send(np.ones(4, np.float32), 1, FP)
