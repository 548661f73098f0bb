"""The models, data and training loops of the DistributedDataParallel tests, shared by
``test_ddp``, ``test_shm_buckets`` and ``test_ddp_devices``: DDP on every rank against one process
trained on the concatenated batch."""
from __future__ import annotations

import numpy as np

STEPS, PER_RANK, IN, HIDDEN, OUT = 5, 6, 7, 9, 4


def make_model(seed: int, sizes=(IN, HIDDEN, HIDDEN, OUT)):
    """A small float64 tanh MLP of layer ``sizes``, the same weights for the same ``seed``."""
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(seed)
    model = MLP(list(sizes), activation="tanh")
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
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
    return [p.array.copy() for p in model.parameters()]


def rank_share(step: int, rank: int, world_size: int, micro: int = 1):
    """This rank's rows of batch ``step``: micro-batch i of every rank is a contiguous block."""
    xs, ys = batches(world_size)
    x = xs[step].reshape(micro, world_size, -1, IN)[:, rank].reshape(-1, IN)
    y = ys[step].reshape(micro, world_size, -1)[:, rank].reshape(-1)
    return x, y


def train_ddp(model, opt, rank: int, world_size: int, micro: int, sync: bool = True):
    """Train on this rank's share of each batch in ``micro`` micro-batches (all but the last
    under ``no_sync``), calling ``sync_gradients()`` after the last backward when ``sync``;
    returns the final parameters and the number of buckets."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    for step in range(STEPS):
        x, y = rank_share(step, rank, world_size, micro)
        opt.zero_grad()
        for i, (xm, ym) in enumerate(zip(np.array_split(x, micro), np.array_split(y, micro))):
            if i < micro - 1:
                with model.no_sync():
                    F.cross_entropy(model(Tensor(xm)), Tensor(ym)).backward()
            else:
                F.cross_entropy(model(Tensor(xm)), Tensor(ym)).backward()
        if sync:
            model.sync_gradients()
        opt.step()
    return [p.array.copy() for p in model.module.parameters()], len(model._buckets)


def ddp_worker(rank: int, world_size: int, optimizer_name: str, auto_sync: bool, micro: int,
               sync: bool = True):
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(seed=rank + 10), auto_sync=auto_sync,
                                    bucket_size_mb=0.0005)  # several buckets even for a tiny MLP
    opt = make_optimizer(optimizer_name, model.parameters())
    return train_ddp(model, opt, rank, world_size, micro, sync)


def check_against_reference(results, reference, rtol=1e-9, atol=1e-12):
    first, buckets = results[0]
    assert buckets > 1
    for params, _ in results[1:]:
        for a, b in zip(first, params):
            assert a.tobytes() == b.tobytes(), "ranks must hold bit-identical parameters"
    for got, want in zip(first, reference):
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol)


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
