"""DistributedDataParallel against one process trained on the concatenated batch."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(240)

STEPS, PER_RANK, IN, HIDDEN, OUT = 5, 6, 7, 9, 4


def make_model(seed: int):
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(seed)
    model = MLP([IN, HIDDEN, HIDDEN, OUT], activation="tanh")
    for p in model.parameters():
        p.data = p.data.astype(np.float64)
    return model


def make_optimizer(name: str, params):
    from neural_arch.optim import SGD, Adam
    if name == "sgd":
        return SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    return Adam(params, lr=0.01)


def batches(world_size: int):
    rng = np.random.default_rng(1234)
    xs = rng.standard_normal((STEPS, world_size * PER_RANK, IN))
    ys = rng.integers(0, OUT, size=(STEPS, world_size * PER_RANK))
    return xs, ys


def train_reference(world_size: int, optimizer_name: str, micro: int = 1):
    """One process, the whole batch, the same initial weights as rank 0."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    model = make_model(seed=10)  # rank 0's seed: DDP starts every rank from its weights
    opt = make_optimizer(optimizer_name, model.parameters())
    xs, ys = batches(world_size)
    for step in range(STEPS):
        opt.zero_grad()
        for x, y in zip(np.array_split(xs[step], micro), np.array_split(ys[step], micro)):
            F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
        opt.step()
    return [p.data.copy() for p in model.parameters()]


def train_ddp(model, opt, rank: int, world_size: int, micro: int):
    """Train on this rank's share of each batch in ``micro`` micro-batches (all but the last
    under ``no_sync``); returns the final parameters and the number of buckets."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    xs, ys = batches(world_size)
    for step in range(STEPS):
        x = xs[step].reshape(micro, world_size, -1, IN)[:, rank].reshape(-1, IN)
        y = ys[step].reshape(micro, world_size, -1)[:, rank].reshape(-1)
        opt.zero_grad()
        for i, (xm, ym) in enumerate(zip(np.array_split(x, micro), np.array_split(y, micro))):
            if i < micro - 1:
                with model.no_sync():
                    F.cross_entropy(model(Tensor(xm)), Tensor(ym)).backward()
            else:
                F.cross_entropy(model(Tensor(xm)), Tensor(ym)).backward()
        model.sync_gradients()
        opt.step()
    return [p.data.copy() for p in model.module.parameters()], len(model._buckets)


def ddp_worker(rank: int, world_size: int, optimizer_name: str, auto_sync: bool, micro: int):
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(seed=rank + 10), auto_sync=auto_sync,
                                    bucket_size_mb=0.0005)  # several buckets even for a tiny MLP
    opt = make_optimizer(optimizer_name, model.parameters())
    return train_ddp(model, opt, rank, world_size, micro)


def check_against_reference(results, reference, rtol=1e-9, atol=1e-12):
    first, buckets = results[0]
    assert buckets > 1
    for params, _ in results[1:]:
        for a, b in zip(first, params):
            assert a.tobytes() == b.tobytes(), "ranks must hold bit-identical parameters"
    for got, want in zip(first, reference):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


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


def two_heads():
    """Head ``a`` always takes part, ``b`` only when asked, ``never`` not at all."""
    from neural_arch.nn import Linear, Module

    class TwoHeads(Module):
        def __init__(self):
            super().__init__()
            self.a = Linear(3, 2)
            self.b = Linear(3, 2)
            self.never = Linear(3, 2)

        def forward(self, x, use_b):
            out = self.a(x)
            return out + self.b(x) if use_b else out
    return TwoHeads()


def unused_worker(rank: int, world_size: int, find_unused: bool):
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel

    model = DistributedDataParallel(two_heads(), find_unused_parameters=find_unused)
    x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
    loss = model(x, use_b=(rank == 0)).sum()
    loss.backward()
    model.sync_gradients()
    m = model.module
    return (m.b.weight.grad.copy(), m.never.weight.grad, m.a.weight.grad.copy())


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
        p.grad = np.full(p.data.shape, float(rank + 1), dtype=np.float32)
    model.sync_gradients()
    return layer.weight.grad.copy(), layer.weight.grad.dtype


def test_gradient_compression_averages_in_half_precision():
    results = run_ranks(compression_worker, 3, "shm")
    for grad, dtype in results:
        assert dtype == np.float32
        np.testing.assert_array_equal(grad, np.full((3, 4), 2.0, dtype=np.float32))
