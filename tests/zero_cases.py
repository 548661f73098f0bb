"""Models, data and training loops of the ZeroRedundancyOptimizer tests: DDP + ZeRO on
each rank's share of a fixed global batch against one process with a plain optimizer on the
whole batch. The global batch does not depend on the world size, so a run may resume on
another number of ranks."""
from __future__ import annotations

import numpy as np

from ddp_cases import IN, OUT, make_model

STEPS, ROWS, BLOCK, VOCAB = 5, 12, 8, 11  # ROWS: the global batch, divisible by 1, 2, 3, 4


def build_model(name: str):
    """The same weights for every call (DDP would broadcast rank 0's anyway), float64."""
    if name == "mlp":
        return make_model(seed=10)
    from neural_arch.core import manual_seed
    from neural_arch.models import GPT, GPTConfig
    from neural_arch.nn import Linear, Module
    manual_seed(11)
    if name == "gpt":
        model = GPT(GPTConfig(block_size=BLOCK, vocab_size=VOCAB, n_layer=2, n_head=2,
                              n_embd=16))
    else:  # "three": three parameters, so a fourth rank owns none

        class Three(Module):
            def __init__(self):
                super().__init__()
                self.a = Linear(IN, 5)
                self.b = Linear(5, OUT, bias=False)

            def forward(self, x):
                return self.b(self.a(x).tanh())
        model = Three()
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def make_optimizer(name: str, params, zero: bool = False, **extra):
    from neural_arch.distributed.optim import ZeroRedundancyOptimizer
    from neural_arch.optim import SGD, Adam, AdamW
    cls, options = {"sgd": (SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)),
                    "adam": (Adam, dict(lr=0.01)),
                    "adamw": (AdamW, dict(lr=0.01, weight_decay=0.1))}[name]
    if zero:
        return ZeroRedundancyOptimizer(params, cls, **options, **extra)
    return cls(params, **options)


def global_batch(model_name: str, step: int):
    rng = np.random.default_rng(100 + step)
    if model_name == "gpt":
        tokens = rng.integers(0, VOCAB, size=(ROWS, BLOCK + 1))
        return tokens[:, :-1], tokens[:, 1:]
    return rng.standard_normal((ROWS, IN)), rng.integers(0, OUT, size=ROWS)


def loss_on(model, model_name: str, x, y):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    if model_name == "gpt":
        return model(Tensor(x), Tensor(y))[1]
    return F.cross_entropy(model(Tensor(x)), Tensor(y))


def train(model, opt, model_name: str, steps, rank: int = 0, world_size: int = 1,
          scheduler=None):
    """Steps ``steps`` of the global batch, this rank's contiguous share of each."""
    for step in steps:
        x, y = global_batch(model_name, step)
        rows = slice(rank * ROWS // world_size, (rank + 1) * ROWS // world_size)
        opt.zero_grad()
        loss_on(model, model_name, x[rows], y[rows]).backward()
        opt.step()
        if scheduler is not None:
            scheduler.step()


def make_scheduler(opt, with_scheduler: bool):
    from neural_arch.optim import StepLR
    return StepLR(opt, step_size=2, gamma=0.5) if with_scheduler else None


def reference(model_name: str, optimizer_name: str, with_scheduler: bool,
              steps=range(STEPS)):
    """One process, the whole batch, a plain optimizer."""
    model = build_model(model_name)
    opt = make_optimizer(optimizer_name, model.parameters())
    train(model, opt, model_name, steps, scheduler=make_scheduler(opt, with_scheduler))
    return [p.array.copy() for p in model.parameters()]


def state_arrays(optimizer):
    """(number, bytes) of the arrays in an optimizer's per-parameter state."""
    arrays = [v for p in optimizer.state for v in optimizer.state[p].values()
              if isinstance(v, np.ndarray)]
    return len(arrays), sum(a.nbytes for a in arrays)
