"""Rank functions of the tensor-parallel layer tests, and the helpers ``tp_gpt_cases`` shares:
each builds the dense layer under a fixed seed (the same on every rank), the parallel one from
its weights, runs both on the same float64 input and asserts, on its rank, that outputs and
every gradient match (a parallel parameter's gradient is its shard of the dense one's). They
return what the parent compares across ranks."""
from __future__ import annotations

import numpy as np

RTOL, ATOL = 1e-10, 1e-12
F64 = np.float64


def close(actual, expected, what, rtol=RTOL, atol=ATOL):
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol,
                               err_msg=what)


def seeded(seed):
    from neural_arch.core.random import manual_seed
    manual_seed(seed)
    return np.random.default_rng(seed + 100)


def leaf(array):
    from neural_arch.core import Tensor
    return Tensor(np.array(array, dtype=F64), requires_grad=True, dtype=F64)


def chunk(array, rank, size, axis=-1):
    return np.split(np.asarray(array), size, axis=axis)[rank]


def weighted_sum(y, weights):
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
    rng = seeded(1)
    dense = Linear(6, 8, dtype=F64)
    from neural_arch.core.random import get_rng
    state = get_rng().bit_generator.state
    layer = ColumnParallelLinear.from_dense(dense, gather_output=gather_output)
    assert get_rng().bit_generator.state == state  # from_dense leaves the global stream alone
    assert layer.weight.shape == (8 // size, 6) and layer.bias.shape == (8 // size,)
    close(layer.weight.array, dense.weight.array[rank * 8 // size:(rank + 1) * 8 // size], "rows")
    x_np, w = rng.standard_normal((3, 5, 6)), rng.standard_normal((3, 5, 8))
    x, xd = leaf(x_np), leaf(x_np)
    yd = dense(xd)
    weighted_sum(yd, w).backward()
    y = layer(x)
    if gather_output:
        close(y.array, yd.array, "gathered output")
        weighted_sum(y, w).backward()
    else:
        close(y.array, chunk(yd.array, rank, size), "output shard")
        weighted_sum(y, chunk(w, rank, size)).backward()
    close(x.grad, xd.grad, "input gradient")
    return check_param_grads(layer, dense, rank, size)


def row_case(rank, size, input_is_parallel):
    from neural_arch.distributed.tensor_parallel import RowParallelLinear
    from neural_arch.nn import Linear
    rng = seeded(2)
    dense = Linear(8, 6, dtype=F64)
    layer = RowParallelLinear.from_dense(dense, input_is_parallel=input_is_parallel)
    assert layer.weight.shape == (6, 8 // size) and layer.bias.shape == (6,)
    x_np, w = rng.standard_normal((3, 5, 8)), rng.standard_normal((3, 5, 6))
    xd = leaf(x_np)
    x = leaf(chunk(x_np, rank, size)) if input_is_parallel else leaf(x_np)
    yd = dense(xd)
    weighted_sum(yd, w).backward()
    y = layer(x)
    close(y.array, yd.array, "output")
    weighted_sum(y, w).backward()
    close(x.grad, chunk(xd.grad, rank, size) if input_is_parallel else xd.grad,
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

    rng = seeded(3)
    dense = Pair(Linear(6, 16, dtype=F64), Linear(16, 6, dtype=F64))
    layer = Pair(ColumnParallelLinear.from_dense(dense.first),
                 RowParallelLinear.from_dense(dense.second))
    x_np, w = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 4, 6))
    x, xd = leaf(x_np), leaf(x_np)
    yd = dense(xd)
    weighted_sum(yd, w).backward()
    y = layer(x)
    close(y.array, yd.array, "output")
    weighted_sum(y, w).backward()
    close(x.grad, xd.grad, "input gradient")
    return check_param_grads(layer, dense, rank, size), y.array


def embedding_case(rank, size):
    from neural_arch.distributed.tensor_parallel import VocabParallelEmbedding
    from neural_arch.nn import Embedding
    rng = seeded(4)
    dense = Embedding(16, 5, dtype=F64)
    layer = VocabParallelEmbedding.from_dense(dense)
    ids = np.concatenate([rng.permutation(16), rng.integers(0, 16, 8)]).reshape(4, 6)
    w = rng.standard_normal((4, 6, 5))
    yd = dense(ids)
    weighted_sum(yd, w).backward()
    y = layer(ids)
    close(y.array, yd.array, "embedding output")
    weighted_sum(y, w).backward()
    return check_param_grads(layer, dense, rank, size)


def cross_entropy_case(rank, size, scale):
    import neural_arch.functional as F
    from neural_arch.distributed.tensor_parallel import vocab_parallel_cross_entropy
    rng = seeded(5)
    logits = rng.standard_normal((3, 5, 16)) * scale
    target = rng.integers(0, 16, (3, 5))
    target[0, :2] = -1
    target[2, 4] = -1
    full = leaf(logits)
    dense = F.cross_entropy(full.reshape(-1, 16), target.reshape(-1), ignore_index=-1)
    dense.backward()
    local = leaf(chunk(logits, rank, size))
    loss = vocab_parallel_cross_entropy(local, target, ignore_index=-1)
    close(loss.item(), dense.item(), "loss")
    loss.backward()
    close(local.grad, chunk(full.grad, rank, size), "logit gradient")
    return loss.item()


def world():
    from neural_arch import distributed as dist
    return dist.new_group(list(range(dist.get_world_size())))
