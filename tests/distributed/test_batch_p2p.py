"""batch_isend_irecv: messages in both directions progress together on every transport.

Two ranks each sending the other more than a transport buffers (32 MiB: the shared-memory ring
holds 2 MiB per direction, MPI switches to rendezvous far below) would wait on each other for
ever with two plain sends; in one batch both move. A deadlock shows as a timeout failure.
"""
import numpy as np

from dist_harness import run_ranks

BIG = 1 << 22  # float64 elements: 32 MiB (loopback TCP buffers hold several MiB)


def _payload(rank, n, salt=0):
    return np.random.default_rng(100 * rank + salt).standard_normal(n)


def _swap_big(rank, world_size):
    from neural_arch import distributed as dist
    peer = 1 - rank
    mine = _payload(rank, BIG)
    theirs = np.empty(BIG)
    # several messages to one peer keep their order; a float32 one with another tag too
    small_out = _payload(rank, 7, 1).astype(np.float32)
    small_in = np.empty(7, np.float32)
    works = dist.batch_isend_irecv([
        dist.P2POp(dist.isend, mine, peer),
        dist.P2POp(dist.irecv, theirs, peer),
        dist.P2POp(dist.isend, small_out, peer, tag=3),
        dist.P2POp(dist.irecv, small_in, peer, tag=3),
    ])
    assert all(w.is_completed() and w.wait() for w in works)
    # a batched message meets a plain call on the other side
    if rank == 0:
        dist.batch_isend_irecv([dist.P2POp("isend", mine[:1000], peer)])
    else:
        got = np.empty(1000)
        dist.recv(got, src=peer)
        assert np.array_equal(got, _payload(0, BIG)[:1000])
    return (np.array_equal(theirs, _payload(peer, BIG)),
            np.array_equal(small_in, _payload(peer, 7, 1).astype(np.float32)))


def test_two_ranks_swap_arrays_larger_than_any_buffer(backend):
    assert run_ranks(_swap_big, 2, backend, timeout=120) == [(True, True)] * 2


def _ring_shift(rank, world_size):
    from neural_arch import distributed as dist
    right, left = (rank + 1) % world_size, (rank - 1) % world_size
    out = _payload(rank, 300_000)  # 2.4 MiB: more than a ring holds
    into = np.empty_like(out)
    dist.batch_isend_irecv([dist.P2POp(dist.irecv, into, left),
                            dist.P2POp(dist.isend, out, right)])
    return np.array_equal(into, _payload(left, 300_000))


def test_three_ranks_shift_a_ring():
    assert run_ranks(_ring_shift, 3, "shm", timeout=120) == [True] * 3


def _errors(rank, world_size):
    from neural_arch import distributed as dist
    found = {}
    for name, call in [
            ("bad op", lambda: dist.P2POp(dist.all_reduce, np.zeros(2), 1 - rank)),
            ("self", lambda: dist.batch_isend_irecv([dist.P2POp(dist.isend, np.zeros(2), rank)])),
            ("empty", lambda: dist.batch_isend_irecv([])),
            ("not an op", lambda: dist.batch_isend_irecv([np.zeros(2)])),
            ("out of range", lambda: dist.batch_isend_irecv(
                [dist.P2POp(dist.isend, np.zeros(2), 5)]))]:
        try:
            call()
        except (ValueError, TypeError) as exc:
            found[name] = f"{type(exc).__name__}: {exc}"
    # a failed batch took no sequence numbers: the ranks still agree afterwards
    out, into = np.full(3, float(rank)), np.empty(3)
    dist.batch_isend_irecv([dist.P2POp(dist.isend, out, 1 - rank),
                            dist.P2POp(dist.irecv, into, 1 - rank)])
    found["after"] = into.tolist()
    return found


def test_bad_ops_are_rejected_before_anything_moves():
    found = run_ranks(_errors, 2, "shm", timeout=60)
    for rank, errors in enumerate(found):
        assert errors["bad op"].startswith("ValueError") and "all_reduce" in errors["bad op"]
        assert "cannot send to or from itself" in errors["self"]
        assert "empty" in errors["empty"]
        assert errors["not an op"].startswith("TypeError") and "ndarray" in errors["not an op"]
        assert "out of range" in errors["out of range"]
        assert errors["after"] == [float(1 - rank)] * 3


def test_the_transport_batch_moves_many_messages_per_peer(backend):
    assert run_ranks(_many_per_peer, 3, backend, timeout=120) == [True] * 3


def _many_per_peer(rank, world_size):
    """Four messages to each peer and four from each, from 8 bytes to 8 MB, in one transport
    batch (``Transport.send_recv_many``): order per peer is kept, peers are independent."""
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.transports.base import Fingerprint
    t = resolve_group(None).transport
    sizes = [1, 70_000, 1_000_000, 3]
    sends, recvs, want = [], [], []
    for peer in range(world_size):
        if peer == rank:
            continue
        for i, n in enumerate(sizes):
            fp = Fingerprint("t", i, "float64", n)
            sends.append((_payload(rank, n, 10 * peer + i), peer, fp))
            buf = np.empty(n)
            recvs.append((buf, peer, fp))
            want.append((buf, _payload(peer, n, 10 * rank + i)))
    t.send_recv_many(sends, recvs)
    return all(np.array_equal(a, b) for a, b in want)


def _isend_irecv(rank, world_size):
    from neural_arch import distributed as dist
    peer = 1 - rank
    if rank == 0:
        work = dist.isend(np.arange(5.0), dst=peer, tag=2)
        assert work.wait()
        return None
    buf = np.empty(5)
    work = dist.irecv(buf, src=peer, tag=2)
    assert work.wait() and work.is_completed()
    return buf.tolist()


def test_isend_and_irecv_return_works():
    assert run_ranks(_isend_irecv, 2, "shm", timeout=60) == [None, [0.0, 1.0, 2.0, 3.0, 4.0]]
