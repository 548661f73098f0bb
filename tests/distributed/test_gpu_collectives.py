"""Collectives on GPU arrays: host staging of CuPy arrays, and the NCCL backend.

The staging path (a CuPy array is copied to pinned host memory, reduced over shm/tcp/mpi and
copied back) runs everywhere against ``fake_cupy``, a NumPy-backed stand-in that counts
transfers, with 2 real processes. With CuPy and a GPU the same checks run on real device arrays
(2 ranks sharing one GPU), and the NCCL transport is checked: one rank on one GPU, and two
ranks when there are two GPUs (NCCL does not allow two ranks of a communicator on one GPU).
"""
from __future__ import annotations

import sys

import numpy as np
import pytest

import fake_cupy
from dist_harness import run_ranks
from gpu_testing import GPUS, needs_gpu, needs_shm
from neural_arch.core import Tensor
from neural_arch.distributed import buffers, transports

pytestmark = pytest.mark.timeout(120)



@pytest.fixture
def fake(monkeypatch):
    import neural_arch.backends.cupy_backend  # noqa: F401 - bound to the real CuPy (or none) first
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    return fake_cupy


def test_staging_copies_to_host_and_commits_back(fake):
    device = fake.asarray(np.arange(6, dtype=np.float32).reshape(2, 3))
    staged = buffers.checked_array(device, "t", writable=True)
    assert isinstance(staged, buffers.HostStaged) and staged.device_array is device
    np.testing.assert_array_equal(staged, device._host)
    flat = buffers.Flat(staged)
    assert flat.staged
    flat.buf *= 2
    assert device._host[1, 2] == 5  # nothing reaches the device before the commit
    flat.commit()
    np.testing.assert_array_equal(device._host, np.arange(6).reshape(2, 3) * 2)


def test_staging_strided_device_arrays_and_tensors(fake):
    base = fake.asarray(np.arange(12, dtype=np.float64).reshape(3, 4))
    strided = base[:, ::2]
    staged = buffers.array_of(strided)
    staged[...] = -np.ones((3, 2))
    np.testing.assert_array_equal(base._host[:, ::2], -1.0)
    np.testing.assert_array_equal(base._host[:, 1::2], np.arange(12).reshape(3, 4)[:, 1::2])
    view = staged.reshape(-1)  # a view of the staged copy never writes back on its own
    view[0] = 99.0
    assert base._host[0, 0] == -1.0
    tensor = Tensor(fake.asarray(np.ones(4, np.float32)))
    assert isinstance(buffers.array_of(tensor), buffers.HostStaged)
    wrapped = buffers.wrap_like(tensor, np.full(4, 3.0, np.float32))
    assert isinstance(wrapped, Tensor) and isinstance(wrapped.array, fake.ndarray)
    assert isinstance(buffers.wrap_like(base, np.zeros(2)), fake.ndarray)


def test_non_arrays_are_still_refused(fake):
    with pytest.raises(TypeError, match="must be a NumPy or CuPy array or a Tensor holding one, "
                                        "got list"):
        buffers.array_of([1.0, 2.0], "all_reduce tensor")


def _device_collectives(rank: int, world_size: int, use_fake: bool) -> dict:
    """Every collective on device arrays; returns host copies of the results."""
    if use_fake:
        cp = fake_cupy.install()
    else:
        import cupy as cp
        cp.cuda.Device(0).use()  # every rank on the one GPU: staging never needs peer access
    from neural_arch import distributed as dist
    out = {}
    x = cp.asarray(np.arange(6, dtype=np.float32) + rank)
    assert dist.all_reduce(x) is x
    out["sum"] = cp.asnumpy(x)
    y = Tensor(cp.asarray(np.full(3, 2.0 * (rank + 1))))
    dist.all_reduce(y, dist.ReduceOp.AVERAGE)
    out["avg"] = cp.asnumpy(y.array)
    b = cp.asarray(np.full(4, rank, dtype=np.int64))
    dist.broadcast(b, src=1)
    out["bcast"] = cp.asnumpy(b)
    gathered = dist.all_gather(cp.asarray(np.array([rank, 10 + rank], dtype=np.int32)))
    out["gather_types"] = sorted({type(g).__module__.split(".")[0] for g in gathered})
    out["gather"] = [cp.asnumpy(g) for g in gathered]
    outputs = [cp.asarray(np.zeros(2, np.int32)) for _ in range(world_size)]
    dist.all_gather(outputs, cp.asarray(np.array([rank, -rank], dtype=np.int32)))
    out["gather_list"] = [cp.asnumpy(o) for o in outputs]
    chunk = cp.asarray(np.zeros(2, np.float64))
    dist.reduce_scatter(chunk, [cp.asarray(np.full(2, 10.0 * r + rank)) for r in range(world_size)])
    out["scatter"] = cp.asnumpy(chunk)
    message = cp.asarray(np.arange(5, dtype=np.float64) * (rank + 1))
    if rank == 0:
        dist.send(message, dst=1)
    else:
        dist.recv(message, src=0)
    out["p2p"] = cp.asnumpy(message)
    return out


def _check_device_results(results: list) -> None:
    for rank, got in enumerate(results):
        np.testing.assert_array_equal(got["sum"], np.arange(6) * 2 + 1)
        np.testing.assert_allclose(got["avg"], np.full(3, 3.0))
        np.testing.assert_array_equal(got["bcast"], np.ones(4))
        assert got["gather_types"] == ["cupy"]
        np.testing.assert_array_equal(np.stack(got["gather"]), [[0, 10], [1, 11]])
        np.testing.assert_array_equal(np.stack(got["gather_list"]), [[0, 0], [1, -1]])
        np.testing.assert_array_equal(got["scatter"], np.full(2, 20.0 * rank + 1))  # sum of 10r + s
        np.testing.assert_array_equal(got["p2p"], np.arange(5.0))


def test_collectives_on_staged_device_arrays_two_processes(backend):
    _check_device_results(run_ranks(_device_collectives, 2, backend, timeout=90, args=(True,)))


def _reduce_scatter_chunk(rank: int, world_size: int) -> np.ndarray:
    cp = fake_cupy.install()
    from neural_arch import distributed as dist
    chunk = dist.reduce_scatter(cp.asarray(np.arange(4, dtype=np.float64) + rank))
    return cp.asnumpy(chunk)


@needs_shm
def test_reduce_scatter_chunk_form_on_device_arrays():
    for rank, chunk in enumerate(run_ranks(_reduce_scatter_chunk, 2, "shm", timeout=60)):
        np.testing.assert_array_equal(chunk, np.arange(4.0)[2 * rank:2 * rank + 2] * 2 + 1)


@needs_gpu
@needs_shm
def test_collectives_on_cupy_arrays_two_ranks_one_gpu():
    _check_device_results(run_ranks(_device_collectives, 2, "shm", timeout=110, args=(False,)))


# ----- NCCL --------------------------------------------------------------------------------
@needs_gpu
def test_nccl_transport_one_rank_native_collectives():
    import cupy as cp

    from neural_arch.distributed.rendezvous.store import TCPStore
    from neural_arch.distributed.transports.nccl import NcclTransport
    from dist_harness import free_port
    assert transports.is_available("nccl")
    store = TCPStore("127.0.0.1", free_port(), 1, is_server=True, secret=b"k" * 32, timeout=30)
    transport = NcclTransport(0, 1, store, timeout=30, device=0)
    try:
        native = transport.native_collectives()
        device = cp.arange(8, dtype=cp.float32)
        native.all_reduce(device, "sum")
        np.testing.assert_array_equal(cp.asnumpy(device), np.arange(8))
        host = np.arange(4, dtype=np.float64)
        native.all_reduce(host, "max")
        np.testing.assert_array_equal(host, np.arange(4))
        gathered = np.zeros(3, np.int64)
        native.all_gather(np.array([1, 2, 3]), gathered)
        np.testing.assert_array_equal(gathered, [1, 2, 3])
        native.barrier()
    finally:
        transport.close()
        store.close()


def _nccl_job(rank: int, world_size: int) -> dict:
    import cupy as cp

    from neural_arch import distributed as dist
    host = np.arange(1000, dtype=np.float32) * (rank + 1)
    dist.all_reduce(host)  # the default algorithms over NCCL send/recv
    device = cp.arange(4, dtype=cp.float32) * (rank + 1)
    dist.all_reduce(device, dist.ReduceOp.AVERAGE, algorithm="native")
    b = np.full(3, rank, np.int64)
    dist.broadcast(b, src=1, algorithm="native")
    return {"host": host, "device": cp.asnumpy(device), "bcast": b}


@pytest.mark.skipif(GPUS < 2, reason=f"NCCL needs one GPU per rank; {GPUS} visible")
def test_nccl_backend_two_ranks():
    for got in run_ranks(_nccl_job, 2, "nccl", timeout=110):
        np.testing.assert_array_equal(got["host"], np.arange(1000) * 3)
        np.testing.assert_allclose(got["device"], np.arange(4) * 1.5)
        np.testing.assert_array_equal(got["bcast"], np.ones(3))
