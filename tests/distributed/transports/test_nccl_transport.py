"""The NCCL transport's own logic, on the CPU: two ranks as threads over ``fake_nccl``.

Rendezvous through a real TCPStore, device selection, the header-then-payload protocol of
send/recv/sendrecv (and its mismatch detection), the generic algorithms running over it, and
the native collectives on host and (fake) device arrays. The real NCCL path is checked in
``test_gpu_collectives.py`` when GPUs are present.
"""
from __future__ import annotations

import sys
import threading

import numpy as np
import pytest

import fake_cupy
import fake_nccl
from neural_arch.distributed import algorithms, transports
from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.rendezvous.store import TCPStore
from neural_arch.distributed.transports.base import Fingerprint

pytestmark = pytest.mark.timeout(60)
_SECRET = b"nccl-transport-test-secret-32byt"


@pytest.fixture
def fake(monkeypatch):
    import neural_arch.backends.cupy_backend  # noqa: F401 - bound to the real CuPy (or none) first
    for name, module in (("cupy", fake_cupy), ("cupy.cuda", fake_cupy.cuda),
                         ("cupy.cuda.nccl", fake_nccl)):
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(fake_cupy.cuda, "nccl", fake_nccl, raising=False)
    monkeypatch.setattr(fake_cupy, "visible_devices", 4)
    return fake_cupy


def _on_ranks(fn, world_size: int = 2, timeout: float = 30.0, devices=None) -> list:
    """``fn(rank, transport)`` on one thread per rank (all on fake GPU 0 unless ``devices``
    says otherwise); results in rank order, or the most telling error raised."""
    devices = devices or [0] * world_size
    from neural_arch.distributed.transports.nccl import NcclTransport
    server = TCPStore("127.0.0.1", 0, world_size, is_server=True, secret=_SECRET, timeout=20)
    stores = [server] + [TCPStore("127.0.0.1", server.port, world_size, secret=_SECRET,
                                  timeout=20) for _ in range(world_size - 1)]
    results, errors = [None] * world_size, [None] * world_size

    def run(rank: int) -> None:
        transport = None
        try:
            transport = NcclTransport(rank, world_size, stores[rank], timeout=15,
                                      device=devices[rank])
            results[rank] = fn(rank, transport)
        except BaseException as exc:  # handed to the test thread
            errors[rank] = exc
        finally:
            if transport is not None:
                transport.close()

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(world_size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    for store in reversed(stores):
        store.close()
    assert not any(t.is_alive() for t in threads), "a rank thread did not finish"
    # A rank that failed on its own explains the others' timeouts: raise its error first.
    for error in sorted((e for e in errors if e is not None),
                        key=lambda e: isinstance(e, (TimeoutError, threading.BrokenBarrierError))):
        raise error
    return results


def test_availability_follows_the_devices(fake):
    from neural_arch.distributed.transports import nccl
    assert nccl.is_available() and transports.is_available("nccl")
    fake.visible_devices = 0
    assert not nccl.is_available() and not transports.is_available("nccl")


def test_point_to_point_messages(fake):
    def exchange(rank, t):
        fp = Fingerprint("p2p", 1, "float32", 5)
        if rank == 0:
            t.send(np.arange(5, dtype=np.float32), 1, fp)
            got = np.zeros(3, np.int64)
            t.recv(got, 1, Fingerprint("p2p", 2, "int64", 3))
        else:
            got = np.zeros(5, np.float32)
            t.recv(got, 0, fp)
            t.send(np.array([7, 8, 9]), 0, Fingerprint("p2p", 2, "int64", 3))
        mine, theirs = np.full(4, rank, np.float64), np.empty(4, np.float64)
        t.sendrecv(mine, 1 - rank, theirs, 1 - rank, Fingerprint("x", 3, "float64", 4))
        t.sendrecv(np.empty(0), 1 - rank, np.empty(0), 1 - rank, Fingerprint("e", 4, "f8", 0))
        return got, theirs

    (got0, theirs0), (got1, theirs1) = _on_ranks(exchange)
    np.testing.assert_array_equal(got0, [7, 8, 9])
    np.testing.assert_array_equal(got1, np.arange(5))
    np.testing.assert_array_equal(theirs0, np.ones(4))
    np.testing.assert_array_equal(theirs1, np.zeros(4))


def test_mismatched_messages_are_detected_and_the_link_is_dropped(fake):
    def mismatch(rank, t):
        if rank == 0:
            t.send(np.zeros(2, np.float32), 1, Fingerprint("all_reduce:sum", 7, "float32", 2))
            return None
        with pytest.raises(CollectiveMismatchError, match=r"expected broadcast:0 #7 .* peer rank "
                                                          r"0 sent all_reduce:sum #7"):
            t.recv(np.zeros(2, np.float32), 0, Fingerprint("broadcast:0", 7, "float32", 2))
        with pytest.raises(PeerFailureError, match="NCCL transport unusable: bad header"):
            t.recv(np.zeros(2, np.float32), 0, Fingerprint("broadcast:0", 8, "float32", 2))
        return "checked"

    assert _on_ranks(mismatch)[1] == "checked"


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("algorithm", ["ring", "recursive_doubling", "native"])
def test_all_reduce_algorithms_over_nccl(fake, world_size, algorithm):
    def reduce(rank, t):
        buf = np.arange(10, dtype=np.float64) * (rank + 1)
        used = algorithms.all_reduce(t, buf, ReduceOp.SUM, Fingerprint("ar", 1, "float64", 10),
                                     algorithm)
        algorithms.barrier(t, Fingerprint("barrier", 2, "uint8", 0), "auto")
        return used, buf

    factor = world_size * (world_size + 1) / 2
    for used, buf in _on_ranks(reduce, world_size):
        assert used == algorithm
        np.testing.assert_array_equal(buf, np.arange(10) * factor)


@pytest.mark.parametrize("id_format", ["signed-chars", "bytes"])
def test_the_unique_id_reaches_nccl_in_the_form_this_cupy_takes(fake, monkeypatch, id_format):
    monkeypatch.setattr(fake_nccl, "ID_FORMAT", id_format)

    def reduce(rank, t):
        buf = np.full(3, rank + 1.0)
        algorithms.all_reduce(t, buf, ReduceOp.SUM, Fingerprint("ar", 1, "float64", 3), "native")
        return buf

    for buf in _on_ranks(reduce):
        np.testing.assert_array_equal(buf, np.full(3, 3.0))


def test_native_collectives_on_host_and_device_arrays(fake):
    def collectives(rank, t):
        native = t.native_collectives()
        host = np.array([1.0, 2.0]) * (rank + 1)
        native.all_reduce(host, ReduceOp.AVERAGE)
        device = fake.asarray(np.array([rank, -rank], dtype=np.int32))
        native.all_reduce(device, "max")
        gathered = np.zeros(4, np.float32)
        native.all_gather(np.full(2, rank, np.float32), gathered)
        b = fake.asarray(np.full(3, rank + 5, np.int64))
        native.broadcast(b, root=1)
        chunk = np.zeros(2, np.float64)
        native.reduce_scatter(np.arange(4, dtype=np.float64) + rank, chunk, "sum")
        native.barrier()
        return host, fake.asnumpy(device), gathered, fake.asnumpy(b), chunk

    for rank, (host, device, gathered, b, chunk) in enumerate(_on_ranks(collectives)):
        np.testing.assert_allclose(host, [1.5, 3.0])
        np.testing.assert_array_equal(device, [1, 0])
        np.testing.assert_array_equal(gathered, [0, 0, 1, 1])
        np.testing.assert_array_equal(b, [6, 6, 6])
        np.testing.assert_array_equal(chunk, (np.arange(4.0) * 2 + 1)[2 * rank:2 * rank + 2])


def test_a_broadcast_with_different_roots_fails_on_every_rank_naming_them(fake):
    def broadcast_from_self(rank, t):
        with pytest.raises(CollectiveMismatchError) as err:
            t.native_collectives().broadcast(np.full(3, rank, np.float32), root=rank)
        return str(err.value)

    for message in _on_ranks(broadcast_from_self):
        assert "rank 0 passed root 0; rank 1 passed root 1" in message, message


def test_bad_arguments_name_their_values(fake):
    def misuse(rank, t):
        with pytest.raises(ValueError, match=r"peer rank 5 is outside \[0, 2\)"):
            t.send(np.zeros(1), 5, Fingerprint("p2p", 1, "float64", 1))
        with pytest.raises(TypeError, match="dtype complex128 is not supported by collectives"):
            t.native_collectives().all_reduce(np.zeros(2, np.complex128))
        with pytest.raises(TypeError, match="NCCL transport cannot carry dtype complex64"):
            t.native_collectives().all_gather(np.zeros(1, np.complex64), np.zeros(2, np.complex64))
        with pytest.raises(ValueError, match="C-contiguous"):
            t.native_collectives().all_reduce(np.zeros((2, 4))[:, ::2])
        return True

    assert all(_on_ranks(misuse))

    def wrong_gpu(rank, t):
        with pytest.raises(ValueError, match="arrays on GPU 1; got shape .* on GPU 0"):
            t.native_collectives().all_reduce(fake.asarray(np.zeros(2)))
        return True

    assert _on_ranks(wrong_gpu, 1, devices=[1])
    from neural_arch.distributed.transports.nccl import NcclTransport
    with pytest.raises(ValueError, match=r"GPU index 4 is outside \[0, 4\)"):
        NcclTransport(0, 1, store=None, timeout=1, device=4)
