"""DistributedDataParallel against one process trained on the concatenated batch."""
from __future__ import annotations

import numpy as np
import pytest

from ddp_cases import check_against_reference, ddp_worker, train_reference, two_heads
from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("world_size", [2, 3])
@pytest.mark.parametrize("optimizer_name", ["sgd", "adam"])
def test_ddp_equals_single_process_on_concatenated_batch(backend, world_size, optimizer_name):
    results = run_ranks(ddp_worker, world_size, backend, args=(optimizer_name, False, 1))
    check_against_reference(results, train_reference(world_size, optimizer_name))


@pytest.mark.parametrize("world_size", [2, 3])
def test_automatic_mode_matches_manual(backend, world_size):
    auto = run_ranks(ddp_worker, world_size, backend, args=("sgd", True, 1))
    manual = run_ranks(ddp_worker, world_size, backend, args=("sgd", False, 1))
    for a, b in zip(auto[0][0], manual[0][0]):
        np.testing.assert_array_equal(a, b)
    check_against_reference(auto, train_reference(world_size, "sgd"))


@pytest.mark.parametrize("auto_sync", [False, True])
def test_no_sync_accumulation_equals_larger_batch(auto_sync):
    micro = 3
    results = run_ranks(ddp_worker, 2, "shm", args=("sgd", auto_sync, micro))
    check_against_reference(results, train_reference(2, "sgd", micro=micro))


def unused_worker(rank: int, world_size: int, find_unused: bool):
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel

    model = DistributedDataParallel(two_heads(), find_unused_parameters=find_unused)
    x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
    loss = model(x, use_b=(rank == 0)).sum()
    loss.backward()
    model.sync_gradients()
    m = model.module
    return (m.b.weight.grad.array.copy(), m.never.weight.grad, m.a.weight.grad.array.copy())


def test_find_unused_parameters_follows_pytorch():
    results = run_ranks(unused_worker, 2, "shm", args=(True,))
    b0, never0, a0 = results[0]
    b1, never1, a1 = results[1]
    assert never0 is None and never1 is None, "unused on every rank: gradient stays None"
    np.testing.assert_array_equal(b0, b1)
    # b is used on rank 0 only (input of ones, two rows): its local grad is 2, rank 1 adds 0.
    np.testing.assert_allclose(b0, np.full((2, 3), 1.0))
    np.testing.assert_allclose(a0, np.full((2, 3), 3.0))  # (2*1 + 2*2) / 2


def test_unused_parameter_without_flag_names_it():
    with pytest.raises(RankFailed, match=r"never\.weight"):
        run_ranks(unused_worker, 2, "shm", args=(False,), timeout=30)


def mismatch_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.models import MLP
    DistributedDataParallel(MLP([4, 5 + rank, 2]))


def test_replicas_with_different_shapes_are_rejected():
    with pytest.raises(RankFailed, match=r"replicas differ at parameter #0.*rank 1"):
        run_ranks(mismatch_worker, 2, "shm", timeout=30)


def compression_worker(rank: int, world_size: int):
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.nn import Linear
    layer = Linear(4, 3)
    model = DistributedDataParallel(layer, gradient_compression=True)
    for p in layer.parameters():
        p.grad = np.full(p.array.shape, float(rank + 1), dtype=np.float32)
    model.sync_gradients()
    return layer.weight.grad.array.copy(), layer.weight.grad.dtype


def test_gradient_compression_averages_in_half_precision():
    results = run_ranks(compression_worker, 3, "shm")
    for grad, dtype in results:
        assert dtype == np.float32
        np.testing.assert_array_equal(grad, np.full((3, 4), 2.0, dtype=np.float32))
