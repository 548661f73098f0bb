"""Models, data and training loops of the FullyShardedDataParallel tests: FSDP on every rank
against one process trained on the concatenated batch (and against DDP)."""
from __future__ import annotations

import functools

import numpy as np

STEPS, PER_RANK, IN, CLASSES, TIME, VOCAB = 4, 2, 7, 4, 8, 11
MLP_SIZES = (IN, 9, 5, CLASSES)
TINY_SIZES = (IN, 1, 1, CLASSES)  # a unit of 2 parameters: smaller than 4 ranks


def make_model(kind: str, seed: int):
    """A float64 model; the same weights for the same seed. ``kind``: "mlp", "tiny" (an MLP
    with a 1-wide bottleneck) or "gpt" (2 layers, n_embd 16, 2 heads, vocab 11, block 8)."""
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    from neural_arch.models.gpt import GPT, GPTConfig
    manual_seed(seed)
    if kind == "gpt":
        model = GPT(GPTConfig(block_size=TIME, vocab_size=VOCAB, n_layer=2, n_head=2, n_embd=16))
    else:
        model = MLP(list(MLP_SIZES if kind == "mlp" else TINY_SIZES), activation="tanh")
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def wrap_policy(kind: str):
    """Each GPT Block, or each Linear of an MLP, is a unit of its own."""
    from neural_arch.distributed.fsdp import transformer_auto_wrap_policy
    from neural_arch.models.gpt import Block
    from neural_arch.nn import Linear
    layer = Block if kind == "gpt" else Linear
    return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={layer})


def make_optimizer(name: str, params):
    from neural_arch.optim import SGD, Adam, AdamW
    if name == "sgd":
        return SGD(params, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-3)
    if name == "adamw":
        return AdamW(params, lr=0.01, weight_decay=0.1)
    return Adam(params, lr=0.01)


def batches(kind: str, world_size: int):
    rng = np.random.default_rng(1234)
    rows = world_size * PER_RANK * 3  # room for 3 micro-batches
    if kind == "gpt":
        xs = rng.integers(0, VOCAB, size=(STEPS, rows, TIME))
        return xs, rng.integers(0, VOCAB, size=(STEPS, rows, TIME))
    xs = rng.standard_normal((STEPS, rows, IN))
    return xs, rng.integers(0, CLASSES, size=(STEPS, rows))


def loss_of(kind: str, model, x, y):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    if kind == "gpt":
        return model(x, y)[1]
    return F.cross_entropy(model(Tensor(x)), Tensor(y))


def share(kind: str, step: int, rank: int, world_size: int, micro: int):
    """This rank's rows of batch ``step`` as ``micro`` micro-batches: micro-batch i of every
    rank is one contiguous block of the whole batch (so the reference can split it the same)."""
    xs, ys = batches(kind, world_size)
    rows = world_size * PER_RANK * micro
    x, y = xs[step][:rows], ys[step][:rows]
    x = x.reshape((micro, world_size, PER_RANK) + x.shape[1:])[:, rank]
    y = y.reshape((micro, world_size, PER_RANK) + y.shape[1:])[:, rank]
    return list(zip(x, y))


def train(kind, model, opt, rank, world_size, micro=1, clip=None, clip_fn=None):
    """Steps of SGD/Adam on this rank's share; micro-batches but the last under ``no_sync``.
    Returns the gradient norm before clipping of each step (when ``clip``)."""
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        pieces = share(kind, step, rank, world_size, micro)
        for i, (x, y) in enumerate(pieces):
            if i < len(pieces) - 1:
                with model.no_sync():
                    loss_of(kind, model, x, y).backward()
            else:
                loss_of(kind, model, x, y).backward()
        if clip is not None:
            norms.append(float(clip_fn(clip)))
        opt.step()
    return norms


def train_reference(kind, world_size, optimizer, micro=1, clip=None):
    """One process on the concatenated batch, from rank 0's initial weights."""
    from neural_arch.optim import clip_grad_norm_
    model = make_model(kind, seed=10)
    opt = make_optimizer(optimizer, model.parameters())
    norms = []
    for step in range(STEPS):
        opt.zero_grad()
        rows = [share(kind, step, r, world_size, micro) for r in range(world_size)]
        for i in range(micro):
            x = np.concatenate([rows[r][i][0] for r in range(world_size)])
            y = np.concatenate([rows[r][i][1] for r in range(world_size)])
            loss_of(kind, model, x, y).backward()  # micro-batch means add up, as under no_sync
        if clip is not None:
            norms.append(float(clip_grad_norm_(model.parameters(), clip)))
        opt.step()
    return dict(model.state_dict()), norms


def fsdp_worker(rank, world_size, kind, strategy, optimizer, wrap, micro=1, clip=None,
                prefetch=True):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model(kind, seed=10 + rank), sharding_strategy=strategy,
                                     auto_wrap_policy=wrap_policy(kind) if wrap else None,
                                     prefetch=prefetch)
    opt = make_optimizer(optimizer, model.parameters())
    norms = train(kind, model, opt, rank, world_size, micro, clip, model.clip_grad_norm_)
    return {"state": model.full_state_dict(), "norms": norms, "memory": model.memory_stats(),
            "shards": [p.array.size for p in model.parameters()],
            "grads": [None if p.grad is None else p.grad.array.size for p in model.parameters()],
            "adam_state": [sorted((k, np.asarray(v).size) for k, v in opt.state[p].items())
                           for p in model.parameters()],
            "module_grads": [n for n, p in model.module.named_parameters() if p.grad is not None]}


def ddp_worker(rank, world_size, kind, optimizer, micro=1):
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(kind, seed=10 + rank))
    opt = make_optimizer(optimizer, model.parameters())
    train(kind, model, opt, rank, world_size, micro)
    return dict(model.module.state_dict())


def check_states(results, reference, rtol=1e-7, atol=1e-10):
    """Every rank holds the same full parameters, and they equal the reference's."""
    first = results[0]["state"]
    assert list(first) == list(reference), "full_state_dict keys are the module's own"
    for other in results[1:]:
        for key in first:
            assert first[key].tobytes() == other["state"][key].tobytes(), \
                f"ranks differ on {key}"
    for key, want in reference.items():
        np.testing.assert_allclose(first[key], want, rtol=rtol, atol=atol, err_msg=key)
