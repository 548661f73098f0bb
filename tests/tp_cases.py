"""Rank functions of the tensor-parallel tests: each builds the dense layer or model under a
fixed seed (the same on every rank), the parallel one from its weights, runs both on the same
float64 input and asserts, on its rank, that outputs and every gradient match (a parallel
parameter's gradient is its shard of the dense one's). They return what the parent compares
across ranks."""
from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-10, 1e-12
F64 = np.float64


def close(actual, expected, what, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol,
                               err_msg=what)


def _seeded(seed):
    from neural_arch.core.random import manual_seed
    manual_seed(seed)
    return np.random.default_rng(seed + 100)


def _leaf(array):
    from neural_arch.core import Tensor
    return Tensor(np.array(array, dtype=F64), requires_grad=True, dtype=F64)


def _chunk(array, rank, size, axis=-1):
    return np.split(np.asarray(array), size, axis=axis)[rank]


def _weighted_sum(y, weights):
    """A scalar whose gradient with respect to ``y`` is ``weights`` (not all ones)."""
    from neural_arch.core import Tensor
    return (y * Tensor(weights, dtype=F64)).sum()


def check_param_grads(parallel, dense, rank, size):
    """Every parameter of ``parallel`` (keys named as in ``dense``) has as gradient its shard
    of the dense gradient; returns the number checked."""
    checked = 0
    dense_targets = dense._state_targets()
    for key, (owner, table, name) in parallel._state_targets().items():
        if table != "_parameters":
            continue
        param = owner._parameters[name]
        d_owner, d_table, d_name = dense_targets[key]
        want = getattr(d_owner, d_table)[d_name].grad
        layout = getattr(owner, "tp_layout", {}).get(name)
        if layout is not None:
            want = layout.shard(want, rank, size)
        close(param.grad, want, f"gradient of {key} on rank {rank}")
        checked += 1
    return checked


def column_case(rank, size, gather_output):
    from neural_arch.distributed.tensor_parallel import ColumnParallelLinear
    from neural_arch.nn import Linear
    rng = _seeded(1)
    dense = Linear(6, 8, dtype=F64)
    from neural_arch.core.random import get_rng
    state = get_rng().bit_generator.state
    layer = ColumnParallelLinear.from_dense(dense, gather_output=gather_output)
    assert get_rng().bit_generator.state == state  # from_dense leaves the global stream alone
    assert layer.weight.shape == (8 // size, 6) and layer.bias.shape == (8 // size,)
    close(layer.weight.data, dense.weight.data[rank * 8 // size:(rank + 1) * 8 // size], "rows")
    x_np, w = rng.standard_normal((3, 5, 6)), rng.standard_normal((3, 5, 8))
    x, xd = _leaf(x_np), _leaf(x_np)
    yd = dense(xd)
    _weighted_sum(yd, w).backward()
    y = layer(x)
    if gather_output:
        close(y.data, yd.data, "gathered output")
        _weighted_sum(y, w).backward()
    else:
        close(y.data, _chunk(yd.data, rank, size), "output shard")
        _weighted_sum(y, _chunk(w, rank, size)).backward()
    close(x.grad, xd.grad, "input gradient")
    return check_param_grads(layer, dense, rank, size)


def row_case(rank, size, input_is_parallel):
    from neural_arch.distributed.tensor_parallel import RowParallelLinear
    from neural_arch.nn import Linear
    rng = _seeded(2)
    dense = Linear(8, 6, dtype=F64)
    layer = RowParallelLinear.from_dense(dense, input_is_parallel=input_is_parallel)
    assert layer.weight.shape == (6, 8 // size) and layer.bias.shape == (6,)
    x_np, w = rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 6))
    xd = _leaf(x_np)
    x = _leaf(_chunk(x_np, rank, size)) if input_is_parallel else _leaf(x_np)
    yd = dense(xd)
    _weighted_sum(yd, w).backward()
    y = layer(x)
    close(y.data, yd.data, "output")
    _weighted_sum(y, w).backward()
    close(x.grad, _chunk(xd.grad, rank, size) if input_is_parallel else xd.grad,
          "input gradient")
    return check_param_grads(layer, dense, rank, size)


def pair_case(rank, size):
    """Column-parallel -> GELU -> row-parallel, as an MLP: one all-reduce each way."""
    import neural_arch.functional as F
    from neural_arch.distributed.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from neural_arch.nn import Linear, Module

    class Pair(Module):
        def __init__(self, first, second):
            super().__init__()
            self.first, self.second = first, second

        def forward(self, x):
            return self.second(F.gelu(self.first(x)))

    rng = _seeded(3)
    dense = Pair(Linear(6, 16, dtype=F64), Linear(16, 6, dtype=F64))
    layer = Pair(ColumnParallelLinear.from_dense(dense.first),
                 RowParallelLinear.from_dense(dense.second))
    x_np, w = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 4, 6))
    x, xd = _leaf(x_np), _leaf(x_np)
    yd = dense(xd)
    _weighted_sum(yd, w).backward()
    y = layer(x)
    close(y.data, yd.data, "output")
    _weighted_sum(y, w).backward()
    close(x.grad, xd.grad, "input gradient")
    return check_param_grads(layer, dense, rank, size), y.data


def embedding_case(rank, size):
    from neural_arch.distributed.tensor_parallel import VocabParallelEmbedding
    from neural_arch.nn import Embedding
    rng = _seeded(4)
    dense = Embedding(16, 5, dtype=F64)
    layer = VocabParallelEmbedding.from_dense(dense)
    ids = np.concatenate([rng.permutation(16), rng.integers(0, 16, 8)]).reshape(4, 6)
    w = rng.standard_normal((4, 6, 5))
    yd = dense(ids)
    _weighted_sum(yd, w).backward()
    y = layer(ids)
    close(y.data, yd.data, "embedding output")
    _weighted_sum(y, w).backward()
    return check_param_grads(layer, dense, rank, size)


def cross_entropy_case(rank, size, scale):
    import neural_arch.functional as F
    from neural_arch.distributed.tensor_parallel import vocab_parallel_cross_entropy
    rng = _seeded(5)
    logits = rng.standard_normal((3, 5, 16)) * scale
    target = rng.integers(0, 16, (3, 5))
    target[0, :2] = -1
    target[2, 4] = -1
    full = _leaf(logits)
    dense = F.cross_entropy(full.reshape(-1, 16), target.reshape(-1), ignore_index=-1)
    dense.backward()
    local = _leaf(_chunk(logits, rank, size))
    loss = vocab_parallel_cross_entropy(local, target, ignore_index=-1)
    close(loss.item(), dense.item(), "loss")
    loss.backward()
    close(local.grad, _chunk(full.grad, rank, size), "logit gradient")
    return loss.item()


def non_divisible_case(rank, size):
    """Each split that does not divide names the layer, the size and the tensor-parallel
    size; returns the messages."""
    from neural_arch.distributed.tensor_parallel import (ColumnParallelLinear,
                                                         RowParallelLinear,
                                                         VocabParallelEmbedding)
    from neural_arch.models.gpt import GPT, GPTConfig
    messages = []
    attempts = [lambda: ColumnParallelLinear(4, 6), lambda: RowParallelLinear(6, 4),
                lambda: VocabParallelEmbedding(10, 4),
                lambda: GPT(GPTConfig(n_head=3, n_embd=12, vocab_size=64), tp_group=_world()),
                lambda: GPT(GPTConfig(n_head=4, n_embd=16, vocab_size=65), tp_group=_world())]
    for attempt in attempts:
        try:
            attempt()
        except ValueError as exc:
            messages.append(str(exc))
        else:
            raise AssertionError(f"no ValueError at tp={size}")
    return messages


def _world():
    from neural_arch import distributed as dist
    return dist.new_group(list(range(dist.get_world_size())))


GPT_SIZES = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32)
BATCH, TIME = 2, 8


def _float64(model):
    for p in model.parameters():
        p.data = p.data.astype(F64)
    return model


def _gpt_pair(seed, sequence_parallel=False, group=None, **config_options):
    """(dense GPT, tensor-parallel GPT over ``group`` (default: a group of the whole world)
    loaded from it), both float64."""
    from neural_arch.models.gpt import GPT, GPTConfig
    _seeded(seed)
    dense = _float64(GPT(GPTConfig(**GPT_SIZES)))
    group = _world() if group is None else group
    parallel = _float64(GPT(GPTConfig(**GPT_SIZES, **config_options), tp_group=group,
                            sequence_parallel=sequence_parallel))
    parallel.load_dense_state_dict(dense.state_dict())
    return dense, parallel


def _tokens(rng):
    idx = rng.integers(0, GPT_SIZES["vocab_size"], (BATCH, TIME))
    targets = rng.integers(0, GPT_SIZES["vocab_size"], (BATCH, TIME))
    targets[0, :2] = -1
    return idx, targets


_COUNTED = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


class _CountCollectives:
    """Counts the collectives the tensor-parallel operators call (through the collectives
    module): ``calls`` maps each name of ``_COUNTED`` to its count."""

    def __init__(self):
        from neural_arch.distributed import collectives
        self.module, self.calls = collectives, dict.fromkeys(_COUNTED, 0)
        self.originals = {name: getattr(collectives, name) for name in _COUNTED}

    def __enter__(self):
        for name, original in self.originals.items():
            setattr(self.module, name, self._counting(name, original))
        return self

    def _counting(self, name, original):
        def counting(*args, **kwargs):
            self.calls[name] += 1
            return original(*args, **kwargs)
        return counting

    def __exit__(self, *exc):
        for name, original in self.originals.items():
            setattr(self.module, name, original)


def block_case(rank, size, sequence_parallel=False):
    """One transformer block: outputs, every gradient, and the collectives each way. Plain:
    one all-reduce per sub-block each way. Sequence-parallel: the block's input and output are
    this rank's positions, and each all-reduce is an all-gather and a reduce-scatter."""
    dense, parallel = _gpt_pair(6, sequence_parallel)
    rng = np.random.default_rng(7)
    x_np, w = rng.standard_normal((BATCH, TIME, 32)), rng.standard_normal((BATCH, TIME, 32))
    xd = _leaf(x_np)
    x = _leaf(_chunk(x_np, rank, size, axis=1) if sequence_parallel else x_np)
    yd = dense.h[0](xd)
    _weighted_sum(yd, w).backward()
    mine = (lambda a: _chunk(a, rank, size, axis=1)) if sequence_parallel else (lambda a: a)
    with _CountCollectives() as forward:
        y = parallel.h[0](x)
    close(y.data, mine(yd.data), "block output")
    with _CountCollectives() as backward:
        _weighted_sum(y, mine(w)).backward()
    close(x.grad, mine(xd.grad), "block input gradient")
    checked = check_param_grads(parallel.h[0], dense.h[0], rank, size)
    return checked, forward.calls, backward.calls


def gpt_case(rank, size, steps, sequence_parallel=False):
    """The whole model: same weights under the same seed, loss and every gradient, then
    ``steps`` AdamW steps; returns what must be identical across ranks."""
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import AdamW
    _seeded(8)
    built = GPT(GPTConfig(**GPT_SIZES), tp_group=_world(),
                sequence_parallel=sequence_parallel).dense_state_dict()
    _seeded(8)
    reference = GPT(GPTConfig(**GPT_SIZES)).state_dict()
    assert list(built) == list(reference)
    for key, value in reference.items():  # initialised as the sharded dense model
        np.testing.assert_array_equal(built[key], value, err_msg=key)

    dense, parallel = _gpt_pair(9, sequence_parallel)
    assert parallel.lm_head.weight is parallel.wte.weight
    rng = np.random.default_rng(10)
    idx, targets = _tokens(rng)
    logits_d, loss_d = dense(idx, targets)
    logits, loss = parallel(idx, targets)
    assert logits.shape == (BATCH, TIME, GPT_SIZES["vocab_size"] // size)
    close(logits.data, _chunk(logits_d.data, rank, size), "logits shard")
    close(loss.item(), loss_d.item(), "loss")
    loss_d.backward()
    loss.backward()
    check_param_grads(parallel, dense, rank, size)
    replicated = {name: p.grad.copy() for name, p in parallel.named_parameters()
                  if "ln_" in name or name == "wpe.weight" or name.endswith("c_proj.bias")}

    opt_d = AdamW(dense.parameters(), lr=1e-2, weight_decay=0.1)
    opt = AdamW(parallel.parameters(), lr=1e-2, weight_decay=0.1)
    losses = []
    for step in range(steps):
        if step:
            idx, targets = _tokens(rng)
            for model in (dense, parallel):
                model.zero_grad()
                model(idx, targets)[1].backward()
        opt_d.step()
        opt.step()
        losses.append(parallel(idx, targets)[1].item())
    state = parallel.dense_state_dict()
    expected = dense.state_dict()
    assert list(state) == list(expected)
    for key, value in expected.items():
        assert state[key].shape == value.shape, key
        close(state[key], value, f"{key} after {steps} AdamW steps", rtol=1e-8, atol=1e-11)
    return replicated, state, losses


def gpt_checkpointing_and_generate_case(rank, size):
    """Activation checkpointing recomputes the parallel blocks (their collectives included)
    during backward: same loss and gradients as the dense model; ``generate`` gathers the last
    logits and samples the dense model's tokens."""
    dense, parallel = _gpt_pair(11, gradient_checkpointing=True)
    idx, targets = _tokens(np.random.default_rng(12))
    loss_d = dense(idx, targets)[1]
    loss = parallel(idx, targets)[1]
    close(loss.item(), loss_d.item(), "loss")
    loss_d.backward()
    loss.backward()
    check_param_grads(parallel, dense, rank, size)
    tokens = parallel.generate(idx[:, :4], 5, rng=np.random.default_rng(13))
    expected = dense.generate(idx[:, :4], 5, rng=np.random.default_rng(13))
    np.testing.assert_array_equal(tokens, expected)
    return tokens


def gpt_subgroups_case(rank, size):
    """Two tensor-parallel groups of 2 in a world of 4 (as the tp dimension of a mesh): each
    trains as the dense model, and their collectives never meet."""
    from neural_arch import distributed as dist
    from neural_arch.optim import AdamW
    groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank makes every group
    dense, parallel = _gpt_pair(14, group=groups[rank // 2])
    local_rank = rank % 2
    rng = np.random.default_rng(15 + rank // 2)  # other data in each group
    idx, targets = _tokens(rng)
    loss_d, loss = dense(idx, targets)[1], parallel(idx, targets)[1]
    close(loss.item(), loss_d.item(), "loss")
    loss_d.backward()
    loss.backward()
    check_param_grads(parallel, dense, local_rank, 2)
    AdamW(dense.parameters(), lr=1e-2).step()
    AdamW(parallel.parameters(), lr=1e-2).step()
    state = parallel.dense_state_dict()
    for key, value in dense.state_dict().items():
        close(state[key], value, key, rtol=1e-8, atol=1e-11)
    return state["h.0.attn.c_attn.weight"]
