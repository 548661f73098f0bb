"""What each rank holds: 1/N of parameters, gradients and optimizer state; full parameters
only while a unit runs (FULL_SHARD); the flat layout for checkpoints; bad input."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import RankFailed, run_ranks
from fsdp_cases import fsdp_worker, make_model, wrap_policy

pytestmark = pytest.mark.timeout(240)


def _unit_sizes(kind: str):
    """Numel of the root unit and of each Block of an unwrapped model (tied weights once)."""
    model = make_model(kind, seed=0)
    blocks = [sum(p.array.size for p in b.parameters()) for b in model.h]
    return [sum(p.array.size for p in model.parameters()) - sum(blocks)] + blocks


def test_gradients_and_optimizer_state_are_shards():
    world = 3
    results = run_ranks(fsdp_worker, world, "shm", args=("gpt", "FULL_SHARD", "adam", True))
    expected = [-(-n // world) for n in _unit_sizes("gpt")]
    for r in results:
        assert r["shards"] == expected
        assert r["grads"] == expected, "each shard's gradient is the shard's size"
        for state in r["adam_state"]:
            sizes = dict(state)
            assert sizes["exp_avg"] in expected and sizes["exp_avg_sq"] in expected
        assert r["module_grads"] == [], "the full gradients are dropped once averaged"
        assert r["memory"]["gathered_bytes"] == 0
        assert r["memory"]["shard_bytes"] == sum(expected) * 8


def memory_worker(rank, world_size, strategy, n_layer, prefetch):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.models.gpt import GPT, GPTConfig
    from neural_arch.optim import SGD
    gpt = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=n_layer, n_head=2, n_embd=16))
    model = FullyShardedDataParallel(gpt, sharding_strategy=strategy, prefetch=prefetch,
                                     auto_wrap_policy=wrap_policy("gpt"))
    opt = SGD(model.parameters(), lr=0.1)
    idx = np.random.default_rng(rank).integers(0, 11, size=(2, 8))
    inside = []
    original = gpt.h[0].attn.forward

    def spy(x):  # what a unit sees of its own and of other units' parameters mid-forward
        inside.append((float(np.abs(gpt.h[0].ln_1.weight.array).sum()),
                       float(np.abs(gpt.h[-1].ln_1.weight.array).sum())))
        return original(x)
    gpt.h[0].attn.forward = spy
    for _ in range(3):
        model.reset_peak_memory_stats()
        opt.zero_grad()
        gpt_loss = model(idx, idx)[1]
        gpt_loss.backward()
        opt.step()
    stats = model.memory_stats()
    return stats, inside, float(np.abs(gpt.h[0].ln_1.weight.array).sum())


def test_full_shard_frees_between_uses():
    results = run_ranks(memory_worker, 2, "shm", args=("FULL_SHARD", 4, False))
    for stats, inside, after in results:
        assert stats["gathered_bytes"] == 0, "nothing stays gathered after a step"
        assert after == 0.0, "released pages read zeros: the memory went back"
        units = _unit_sizes_for(4)
        # without prefetch, at most the root and one block are gathered at once
        assert stats["peak_gathered_bytes"] == (units[0] + max(units[1:])) * 4
        assert all(own > 0 and other == 0.0 for own, other in inside), \
            "a block runs with its own parameters gathered and the others freed"


def test_prefetch_gathers_one_unit_ahead():
    results = run_ranks(memory_worker, 2, "shm", args=("FULL_SHARD", 4, True))
    units = _unit_sizes_for(4)
    for stats, inside, _ in results:
        assert stats["gathered_bytes"] == 0
        assert stats["peak_gathered_bytes"] == (units[0] + 2 * max(units[1:])) * 4
        assert stats["peak_gathered_bytes"] < stats["full_bytes"]


def test_shard_grad_op_keeps_full_parameters():
    results = run_ranks(memory_worker, 2, "shm", args=("SHARD_GRAD_OP", 2, True))
    for stats, inside, after in results:
        assert stats["gathered_bytes"] == stats["full_bytes"]
        assert after > 0.0


def _unit_sizes_for(n_layer):
    from neural_arch.models.gpt import GPT, GPTConfig
    model = GPT(GPTConfig(block_size=8, vocab_size=11, n_layer=n_layer, n_head=2, n_embd=16))
    blocks = [sum(p.array.size for p in b.parameters()) for b in model.h]
    return [sum(p.array.size for p in model.parameters()) - sum(blocks)] + blocks


def layout_worker(rank, world_size):
    from neural_arch import distributed as dist
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("gpt", seed=3), auto_wrap_policy=wrap_policy("gpt"))
    full = model.full_state_dict()
    shards = model.flat_shards()
    everyone = dist.all_gather_object([s.shard.array.copy() for s in shards])
    rebuilt = {}
    for i, flat_shard in enumerate(shards):
        flat = np.concatenate([theirs[i] for theirs in everyone])
        assert flat.size == flat_shard.padded_numel and not flat[flat_shard.numel:].any()
        for entry in flat_shard.entries:
            rebuilt[entry.fqn] = flat[entry.offset:entry.offset + entry.numel].reshape(entry.shape)
    block = next(s for s in shards if s.unit == "h.1")
    new_flat = np.arange(block.numel, dtype=np.float64)
    model.load_flat("h.1", new_flat)
    after = model.full_state_dict()
    return full, rebuilt, [s.unit for s in shards], block.entries, after


def test_flat_shards_reassemble_the_full_state_dict():
    for full, rebuilt, units, entries, after in run_ranks(layout_worker, 3, "shm"):
        assert units == ["", "h.0", "h.1"]
        for key, value in rebuilt.items():
            np.testing.assert_array_equal(value, full[key])
        assert set(full) - set(rebuilt) == {"lm_head.weight"}  # tied to wte.weight
        for entry in entries:
            np.testing.assert_array_equal(after[entry.fqn].reshape(-1),
                                          np.arange(entry.offset, entry.offset + entry.numel))
        np.testing.assert_array_equal(after["h.0.ln_1.weight"], full["h.0.ln_1.weight"])


def load_worker(rank, world_size, strategy):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = FullyShardedDataParallel(make_model("gpt", seed=rank), sharding_strategy=strategy,
                                     auto_wrap_policy=wrap_policy("gpt"))
    wanted = make_model("gpt", seed=99)
    model.load_full_state_dict(wanted.state_dict())
    loaded = model.full_state_dict()
    idx = np.arange(16).reshape(2, 8) % 11
    logits = model(idx)[0].numpy().copy()
    with model.summon_full_params():
        summoned = model.module.h[1].mlp.c_fc.bias.array.copy()
        model.module.h[1].mlp.c_fc.bias.array[...] = 7.0
    with model.summon_full_params(writeback=False):
        model.module.ln_f.bias.array[...] = 5.0
    final = model.full_state_dict()
    return loaded, logits, wanted(idx)[0].numpy(), summoned, final


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_load_full_state_dict_and_summon_full_params(strategy):
    want = make_model("gpt", seed=99).state_dict()
    for loaded, logits, dense_logits, summoned, final in run_ranks(load_worker, 2, "shm",
                                                                    args=(strategy,)):
        for key in want:
            np.testing.assert_array_equal(loaded[key], want[key])
        np.testing.assert_allclose(logits, dense_logits, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(summoned, want["h.1.mlp.c_fc.bias"])
        assert (final["h.1.mlp.c_fc.bias"] == 7.0).all(), "writeback reaches the shards"
        np.testing.assert_array_equal(final["ln_f.bias"], want["ln_f.bias"])


def mismatch_worker(rank, world_size):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.models import MLP
    FullyShardedDataParallel(MLP([4, 5 + rank, 2]))


def test_replicas_with_different_shapes_are_rejected():
    with pytest.raises(RankFailed, match=r"replicas differ at parameter #0.*rank 1"):
        run_ranks(mismatch_worker, 2, "shm", timeout=60)


def test_unknown_strategy_names_the_choices():
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    with pytest.raises(ValueError, match=r"'ZERO_9'.*FULL_SHARD.*SHARD_GRAD_OP.*NO_SHARD"):
        FullyShardedDataParallel(make_model("mlp", 0), sharding_strategy="ZERO_9")


def test_a_unit_mixing_dtypes_is_rejected(one_rank_group):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    model = make_model("mlp", 0)
    model[0].bias.array = model[0].bias.array.astype(np.float32)
    with pytest.raises(ValueError, match=r"mixes parameter dtypes.*float32.*float64"):
        FullyShardedDataParallel(model)
    model = make_model("mlp", 0)  # one dtype per unit is enough
    for p in model[0].parameters():
        p.array = p.array.astype(np.float32)
    wrapped = FullyShardedDataParallel(model, auto_wrap_policy=wrap_policy("mlp"))
    assert [p.dtype for p in wrapped.parameters()] == [np.float32, np.float64, np.float64]


def test_zero_stages_map_onto_strategies_and_device_ids_are_refused():
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    assert [ShardingStrategy.for_zero_stage(s) for s in (0, 2, 3)] == [
        ShardingStrategy.NO_SHARD, ShardingStrategy.SHARD_GRAD_OP, ShardingStrategy.FULL_SHARD]
    with pytest.raises(ValueError, match=r"got 1 \(stage 1 is ZeroRedundancyOptimizer\)"):
        ShardingStrategy.for_zero_stage(1)
    assert ShardingStrategy.parse("shard_grad_op") is ShardingStrategy.SHARD_GRAD_OP
    with pytest.raises(ValueError, match="device_id=0.*CPU"):
        FullyShardedDataParallel(make_model("mlp", 0), device_id=0)
