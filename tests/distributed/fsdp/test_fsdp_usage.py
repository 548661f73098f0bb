"""Ways of calling the wrapper beyond one forward and one backward per step: evaluation
without a graph, two forwards before one backward, parameters some ranks do not use."""
from __future__ import annotations

import numpy as np
import pytest

from ddp_cases import two_heads
from dist_harness import run_ranks
from fsdp_cases import make_model, wrap_policy

pytestmark = pytest.mark.timeout(240)


def eval_worker(rank, world_size):
    from neural_arch.core import no_grad
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("gpt", seed=5), auto_wrap_policy=wrap_policy("gpt"))
    idx = np.arange(16).reshape(2, 8) % 11
    with no_grad():
        logits = model(idx)[0].numpy().copy()
    return logits, model.memory_stats()["gathered_bytes"]


def test_evaluation_without_a_graph_frees_everything():
    want = make_model("gpt", seed=5)(np.arange(16).reshape(2, 8) % 11)[0].numpy()
    for logits, gathered in run_ranks(eval_worker, 2, "shm"):
        np.testing.assert_allclose(logits, want, rtol=1e-12, atol=1e-12)
        assert gathered == 0


def two_forwards_worker(rank, world_size, strategy):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.optim import SGD
    model = FullyShardedDataParallel(make_model("gpt", seed=5), sharding_strategy=strategy,
                                     auto_wrap_policy=wrap_policy("gpt"))
    opt = SGD(model.parameters(), lr=0.5)
    rng = np.random.default_rng(7)
    batches = rng.integers(0, 11, size=(world_size, 2, 2, 8))[rank]
    for _ in range(2):  # two iterations: the second one prefetches
        opt.zero_grad()
        first = model(batches[0], batches[0])[1]
        second = model(batches[1], batches[1])[1]
        (first + second).backward()
        opt.step()
    return model.full_state_dict()


def _two_forwards_reference(world_size):
    from neural_arch.optim import SGD
    model = make_model("gpt", seed=5)
    opt = SGD(model.parameters(), lr=0.5)
    batches = np.random.default_rng(7).integers(0, 11, size=(world_size, 2, 2, 8))
    for _ in range(2):
        opt.zero_grad()
        first = model(np.concatenate(batches[:, 0]), np.concatenate(batches[:, 0]))[1]
        second = model(np.concatenate(batches[:, 1]), np.concatenate(batches[:, 1]))[1]
        (first + second).backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_two_forwards_then_one_backward(strategy):
    want = _two_forwards_reference(2)
    for state in run_ranks(two_forwards_worker, 2, "shm", args=(strategy,)):
        for key in want:
            np.testing.assert_allclose(state[key], want[key], rtol=1e-9, atol=1e-12,
                                       err_msg=key)


def unused_worker(rank, world_size):
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.optim import SGD
    results = []
    for wrapper in (FullyShardedDataParallel, DistributedDataParallel):
        from neural_arch.core import manual_seed
        manual_seed(3)
        heads = two_heads()
        model = (wrapper(heads) if wrapper is FullyShardedDataParallel
                 else wrapper(heads, find_unused_parameters=True))
        opt = SGD(model.parameters(), lr=1.0)
        x = Tensor(np.ones((2, 3), dtype=np.float32) * (rank + 1))
        model(x, use_b=(rank == 0)).sum().backward()
        opt.step()
        state = model.full_state_dict() if wrapper is FullyShardedDataParallel \
            else heads.state_dict()
        results.append(state)
    return results


def test_a_parameter_used_on_one_rank_only_matches_ddp():
    """Head ``b`` takes part on rank 0 only, ``never`` nowhere (one unit holds them all)."""
    for fsdp_state, ddp_state in run_ranks(unused_worker, 2, "shm"):
        for key in ddp_state:
            np.testing.assert_allclose(fsdp_state[key], ddp_state[key], rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("strategy,aliased", [("NO_SHARD", True), ("FULL_SHARD", False)])
def test_unsharded_parameters_are_kept_once(one_rank_group, strategy, aliased):
    """NO_SHARD's shard is the model's own copy (as DDP's memory); FULL_SHARD on one rank
    still frees its gathered copy, so its shard must be separate. Both train as the plain
    model; zero_grad() also drops what no_sync() accumulated."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.optim import SGD
    model = FullyShardedDataParallel(make_model("mlp", 1), sharding_strategy=strategy)
    plain = make_model("mlp", 1)
    shard = next(model.parameters())
    assert np.shares_memory(shard.array, model.module[0].weight.array) == aliased
    x, y = Tensor(np.linspace(-1, 1, 21).reshape(3, 7)), Tensor(np.array([0, 3, 1]))
    for net in (model, plain):
        opt = SGD(net.parameters(), lr=0.3, momentum=0.9)
        for _ in range(3):
            opt.zero_grad()
            F.cross_entropy(net(x), y).backward()
            opt.step()
    for key, value in plain.state_dict().items():
        np.testing.assert_allclose(model.full_state_dict()[key], value, rtol=1e-12, err_msg=key)
    with model.no_sync():
        F.cross_entropy(model(x), y).backward()
    assert model.module[0].weight.grad is not None
    model.zero_grad()
    assert all(p.grad is None for p in model.module.parameters())


def test_summon_during_backward_is_refused_and_a_failed_forward_leaves_no_trace(one_rank_group):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("mlp", 1), auto_wrap_policy=wrap_policy("mlp"))
    x, y = Tensor(np.ones((2, 7))), Tensor(np.array([0, 1]))
    loss = F.cross_entropy(model(x), y)
    loss.register_hook(lambda grad: model.summon_full_params().__enter__())
    with pytest.raises(RuntimeError, match="summon_full_params.*during"):
        loss.backward()
    with pytest.raises(ValueError, match="linear"):
        model(Tensor(np.ones((2, 5))))  # the wrong width: the first unit raises
    assert model.memory_stats()["gathered_bytes"] == 0
    F.cross_entropy(model(x), y).backward()  # and training goes on
    assert all(p.grad is not None for p in model.parameters())
    assert model.full_state_dict().keys() == make_model("mlp", 1).state_dict().keys()


def generate_worker(rank, world_size):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("gpt", seed=5), auto_wrap_policy=wrap_policy("gpt"))
    prompt = np.array([[1, 2, 3]])
    with model.summon_full_params(writeback=False):  # the module's own methods need it
        tokens = model.module.generate(prompt, 5, rng=np.random.default_rng(0))
    return tokens, model.memory_stats()["gathered_bytes"]


def test_the_module_s_own_methods_run_inside_summon_full_params():
    want = make_model("gpt", seed=5).generate(np.array([[1, 2, 3]]), 5,
                                              rng=np.random.default_rng(0))
    for tokens, gathered in run_ranks(generate_worker, 2, "shm"):
        np.testing.assert_array_equal(tokens, want)
        assert gathered == 0
