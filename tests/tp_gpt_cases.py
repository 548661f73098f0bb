"""Rank functions of the tensor-parallel GPT tests: the dense GPT built under a fixed seed on
every rank, the parallel one loaded from its state, both run in float64 on the same tokens;
each rank asserts that logits, loss and every gradient match (its shard of each), and returns
what the parent compares across ranks."""
from __future__ import annotations

import numpy as np

from tp_cases import F64, check_param_grads, chunk, close, leaf, seeded, weighted_sum, world


GPT_SIZES = dict(block_size=16, vocab_size=64, n_layer=2, n_head=4, n_embd=32)
BATCH, TIME = 2, 8


def _float64(model):
    for p in model.parameters():
        p.array = p.array.astype(F64)
    return model


def _gpt_pair(seed, sequence_parallel=False, group=None, **config_options):
    """(dense GPT, tensor-parallel GPT over ``group`` (default: a group of the whole world)
    loaded from it), both float64."""
    from neural_arch.distributed.tensor_parallel import parallelize_gpt
    from neural_arch.models.gpt import GPT, GPTConfig
    seeded(seed)
    dense = _float64(GPT(GPTConfig(**GPT_SIZES)))
    group = world() if group is None else group
    parallel = _float64(parallelize_gpt(GPT(GPTConfig(**GPT_SIZES, **config_options)), group,
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
    xd = leaf(x_np)
    x = leaf(chunk(x_np, rank, size, axis=1) if sequence_parallel else x_np)
    yd = dense.h[0](xd)
    weighted_sum(yd, w).backward()
    mine = (lambda a: chunk(a, rank, size, axis=1)) if sequence_parallel else (lambda a: a)
    with _CountCollectives() as forward:
        y = parallel.h[0](x)
    close(y.array, mine(yd.array), "block output")
    with _CountCollectives() as backward:
        weighted_sum(y, mine(w)).backward()
    close(x.grad, mine(xd.grad), "block input gradient")
    checked = check_param_grads(parallel.h[0], dense.h[0], rank, size)
    return checked, forward.calls, backward.calls


def gpt_case(rank, size, steps, sequence_parallel=False):
    """The whole model: same weights under the same seed, loss and every gradient, then
    ``steps`` AdamW steps; returns what must be identical across ranks."""
    from neural_arch.core.random import get_rng
    from neural_arch.distributed.tensor_parallel import parallelize_gpt
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import AdamW
    seeded(8)
    built = parallelize_gpt(GPT(GPTConfig(**GPT_SIZES)), world(),
                            sequence_parallel=sequence_parallel).dense_state_dict()
    after_parallel = get_rng().bit_generator.state
    seeded(8)
    reference = GPT(GPTConfig(**GPT_SIZES)).state_dict()
    assert get_rng().bit_generator.state == after_parallel  # dropout's draws stay in step
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
    close(logits.array, chunk(logits_d.array, rank, size), "logits shard")
    close(loss.item(), loss_d.item(), "loss")
    loss_d.backward()
    loss.backward()
    check_param_grads(parallel, dense, rank, size)
    replicated = {name: p.grad.array.copy() for name, p in parallel.named_parameters()
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


def gpt_checkpointing_and_generate_case(rank, size, sequence_parallel):
    """Activation checkpointing recomputes the parallel blocks (their collectives included)
    during backward: same loss and gradients as the dense model; ``generate`` gathers the last
    logits and samples the dense model's tokens."""
    dense, parallel = _gpt_pair(11, sequence_parallel, gradient_checkpointing=True)
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
