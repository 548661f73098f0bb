"""Mixed precision: float16 gathers, compute and gradient averaging, float32 shards; the
sharded loss scaler skips an overflowing step on every rank."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.nn.module_state import state_dict_copy

from dist_harness import run_ranks
from fsdp_cases import STEPS, make_model, share, wrap_policy

pytestmark = pytest.mark.timeout(240)


def _float32_mlp(seed):
    model = make_model("mlp", seed)
    for p in model.parameters():
        p.array = p.array.astype(np.float32)
    return model


def reference(world_size, skip=()):
    """float32, one process, the concatenated batch; steps in ``skip`` are not taken."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import Adam
    model = _float32_mlp(10)
    opt = Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        if step in skip:
            continue
        pieces = [share("mlp", step, r, world_size, 1)[0] for r in range(world_size)]
        x = np.concatenate([p[0] for p in pieces]).astype(np.float32)
        y = np.concatenate([p[1] for p in pieces])
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
        opt.step()
    return state_dict_copy(model)  # arrays: the state dict's tensors share the model's storage


def mixed_worker(rank, world_size, strategy, init_scale, inject_inf_on=None):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed.fsdp import FullyShardedDataParallel, ShardedGradScaler
    from neural_arch.optim import Adam
    model = FullyShardedDataParallel(_float32_mlp(10 + rank), sharding_strategy=strategy,
                                     auto_wrap_policy=wrap_policy("mlp"), mixed_precision=True)
    opt = Adam(model.parameters(), lr=0.01)
    scaler = ShardedGradScaler(init_scale=init_scale, backoff_factor=2.0 ** -8)
    skipped, scales, dtypes = [], [], set()
    for step in range(STEPS):
        x, y = share("mlp", step, rank, world_size, 1)[0]
        opt.zero_grad()
        logits = model(Tensor(x))
        dtypes.add(("compute", str(model.module[0].weight.array.dtype)))
        dtypes.add(("output", str(logits.dtype)))
        scaler.scale(F.cross_entropy(logits, Tensor(y))).backward()
        if step == 0 and rank == inject_inf_on:
            model.flat_shards()[-1].shard.grad[0] = np.inf  # an overflow only this rank sees
        skipped.append(scaler.unscale_(opt))  # the verdict step() acts on
        scaler.step(opt)
        scaler.update()
        scales.append(scaler.get_scale())
    dtypes.update(("shard", str(p.dtype)) for p in model.parameters())
    dtypes.update(("shard grad", str(p.grad.dtype)) for p in model.parameters())
    return model.full_state_dict(), skipped, scales, dtypes, model.memory_stats()


@pytest.mark.parametrize("strategy,world_size", [("FULL_SHARD", 2), ("SHARD_GRAD_OP", 3),
                                                 ("NO_SHARD", 2)])
def test_mixed_precision_matches_float32_to_float16_tolerance(strategy, world_size):
    results = run_ranks(mixed_worker, world_size, "shm", args=(strategy, 1024.0))
    want = reference(world_size)
    for state, skipped, scales, dtypes, memory in results:
        assert not any(skipped) and scales == [1024.0] * STEPS
        assert dtypes == {("compute", "float16"), ("output", "float32"), ("shard", "float32"),
                          ("shard grad", "float32")}
        copies = 1 if strategy == "NO_SHARD" else world_size  # shards that make a whole
        assert memory["full_bytes"] * 2 == memory["shard_bytes"] * copies, \
            "full parameters are gathered in float16: half the bytes of the float32 masters"
        for key in want:
            assert state[key].dtype == np.float32
            np.testing.assert_allclose(state[key], want[key], rtol=0, atol=1e-3, err_msg=key)
            assert state[key].tobytes() == results[0][0][key].tobytes()
    # and float16 is not float32: the two differ beyond float32 rounding
    assert max(np.abs(results[0][0][k] - want[k]).max() for k in want) > 1e-6


def test_an_overflow_on_one_rank_skips_the_step_everywhere():
    results = run_ranks(mixed_worker, 2, "shm", args=("FULL_SHARD", 1024.0, 1))
    want = reference(2, skip={0})
    for state, skipped, scales, _, _ in results:
        assert skipped == [True] + [False] * (STEPS - 1)
        assert scales == [4.0] * STEPS  # 1024 * 2**-8 after the overflow
        for key in want:
            np.testing.assert_allclose(state[key], want[key], rtol=0, atol=1e-3, err_msg=key)


def test_a_scale_too_large_for_float16_overflows_and_backs_off():
    results = run_ranks(mixed_worker, 2, "tcp", args=("FULL_SHARD", 2.0 ** 30))
    (state0, skipped0, scales0, _, _), (state1, skipped1, scales1, _, _) = results
    assert skipped0[0] and skipped0 == skipped1 and scales0 == scales1
    assert not skipped0[-1], "the scale backs off until the step is taken"
    for key in state0:
        assert state0[key].tobytes() == state1[key].tobytes()
