"""LossScaler: the update rule, scaling and unscaling, state, and agreement across ranks."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def scaler(**kwargs):
    from neural_arch.distributed.advanced import LossScaler
    return LossScaler(**kwargs)


def scales_after(s, flags):
    out = []
    for flag in flags:
        s.update(flag)
        out.append(s.get_scale())
    return out


def test_defaults():
    s = scaler()
    assert (s.scale_value, s.growth_factor, s.backoff_factor, s.growth_interval, s.min_scale,
            s.dynamic) == (65536.0, 2.0, 0.5, 1000, 1.0, True)


def test_update_rule_backoff_floor_and_growth_window():
    s = scaler(init_scale=8.0, growth_interval=3, min_scale=2.0)
    flags = [False, False, False,      # 3 clean steps: grow to 16
             True,                     # overflow: halve to 8, restart the window
             False, False, True,       # overflow before the window completes: 4
             False, False, False,      # grow to 8
             True, True, True, True]   # 4, 2, then never below min_scale
    assert scales_after(s, flags) == [8, 8, 16, 8, 8, 8, 4, 4, 4, 8, 4, 2, 2, 2]


def test_static_scale_never_changes():
    s = scaler(init_scale=128.0, growth_interval=1, dynamic=False)
    assert scales_after(s, [True, False, False, True]) == [128.0] * 4


def test_growth_stops_at_the_float32_range():
    s = scaler(init_scale=2.0 ** 127, growth_interval=1)
    assert scales_after(s, [False, False]) == [2.0 ** 127] * 2


def test_update_rule_matches_torch_grad_scaler():
    torch = pytest.importorskip("torch")
    flags = list(np.random.default_rng(5).random(300) < 0.15)
    ours = scaler(init_scale=2.0 ** 16, growth_interval=4, min_scale=2.0 ** -60)
    theirs = torch.amp.GradScaler("cpu", init_scale=2.0 ** 16, growth_interval=4)
    param = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([param], lr=0.0)
    want = []
    for flag in flags:
        theirs.scale(torch.zeros(()))  # GradScaler creates its scale on first use
        param.grad = torch.tensor([float("inf") if flag else 1.0])
        theirs.step(opt)
        theirs.update()
        want.append(theirs.get_scale())
    assert scales_after(ours, flags) == want


def test_scale_multiplies_the_loss_and_its_gradients():
    from neural_arch.core import Tensor
    s = scaler(init_scale=1024.0)
    w = Tensor(np.array([1.5, -2.0], dtype=np.float32), requires_grad=True)
    loss = (w * w).sum()
    scaled = s.scale(loss)
    assert float(scaled.array) == 1024.0 * 6.25
    scaled.backward()
    np.testing.assert_array_equal(w.grad, 1024.0 * 2 * w.array)
    s.unscale_([w])
    np.testing.assert_array_equal(w.grad, 2 * w.array)


def test_unscale_divides_arrays_in_place_in_their_precision():
    s = scaler(init_scale=2.0 ** 10)
    half = np.array([1024.0, 3.0, -512.0], dtype=np.float16)
    single = np.array([2048.0, 1.0], dtype=np.float32)
    s.unscale_([half, single, None])
    assert half.dtype == np.float16 and single.dtype == np.float32
    np.testing.assert_array_equal(half, np.array([1.0, 3.0 / 1024, -0.5], dtype=np.float16))
    np.testing.assert_array_equal(single, np.array([2.0, 1.0 / 1024], dtype=np.float32))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_found_inf_sees_any_nonfinite_value(bad):
    from neural_arch.distributed.advanced import LossScaler
    clean = [np.ones(3, dtype=np.float16), np.zeros((2, 2), dtype=np.float32)]
    assert LossScaler.found_inf(clean) is False
    dirty = clean + [np.array([0.0, bad, 1.0], dtype=np.float32)]
    assert LossScaler.found_inf(dirty) is True
    assert LossScaler.found_inf(np.array([bad])) is True  # a single array is accepted too


def test_state_round_trip_continues_identically():
    a = scaler(init_scale=64.0, growth_interval=5, min_scale=4.0)
    scales_after(a, [False, True, False, False, False])
    state = a.state_dict()
    assert state["scale"] == 32.0 and state["_growth_tracker"] == 3
    b = scaler()
    b.load_state_dict(state)
    assert b.state_dict() == state
    tail = [False, False, True, True, True, False]
    assert scales_after(b, tail) == scales_after(a, tail) == [32, 64, 32, 16, 8, 8]


def test_load_state_dict_rejects_incomplete_or_inconsistent_state():
    s = scaler()
    state = s.state_dict()
    with pytest.raises(KeyError, match="_growth_tracker"):
        s.load_state_dict({k: v for k, v in state.items() if k != "_growth_tracker"})
    with pytest.raises(ValueError, match=r"_growth_tracker must be in \[0, 1000\), got 1000"):
        s.load_state_dict(dict(state, _growth_tracker=1000))
    assert s.state_dict() == state  # a rejected state leaves the scaler as it was


@pytest.mark.parametrize("kwargs,error,text", [
    ({"init_scale": 0.0}, ValueError, "init_scale must be a finite number > 0, got 0.0"),
    ({"init_scale": "big"}, TypeError, "init_scale must be a number, got str"),
    ({"growth_factor": 1.0}, ValueError, "growth_factor must be > 1, got 1.0"),
    ({"backoff_factor": 1.5}, ValueError, "backoff_factor must be < 1, got 1.5"),
    ({"growth_interval": 0}, ValueError, "growth_interval must be >= 1, got 0"),
    ({"growth_interval": 2.5}, TypeError, "growth_interval must be an int, got float"),
    ({"init_scale": 2.0, "min_scale": 4.0}, ValueError, "min_scale (4.0) must not exceed"),
])
def test_bad_arguments_raise_with_their_values(kwargs, error, text):
    with pytest.raises(error) as info:
        scaler(**kwargs)
    assert text in str(info.value)


# ----------------------------------------------------------------------- across ranks
def overflow_worker(rank: int, world_size: int, mixed: bool, how: str, culprit: int):
    """Four optimizer steps; in the second only ``culprit`` sees a non-finite gradient,
    injected after the all-reduce ("after_sync") or coming from its input ("input")."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    manual_seed(rank)
    config = DistributedTrainingConfig(mixed_precision=mixed, loss_scale=1024.0,
                                       gradient_accumulation_steps=2)
    model = AdvancedDistributedDataParallel(MLP([4, 6, 3]), config)
    opt = SGD(model.parameters(), lr=0.1)
    rng = np.random.default_rng(rank)
    real_sync = model.ddp.sync_gradients

    def sync_then_poison():
        real_sync()
        model.module[0].weight.grad[0, 0] = np.nan
    stepped, snapshots, scales = [], [], []
    for window in range(4):
        poison = window == 1 and rank == culprit
        if poison and how == "after_sync":
            model.ddp.sync_gradients = sync_then_poison
        for _ in range(2):
            x = rng.standard_normal((5, 4)).astype(np.float32)
            if poison and how == "input":
                x[2, 1] = np.inf
            loss = F.cross_entropy(model(Tensor(x)), Tensor(rng.integers(0, 3, 5)))
            last = model.backward_step(loss, opt)
        stepped.append(last)
        model.ddp.sync_gradients = real_sync
        snapshots.append([p.array.copy() for p in model.parameters()])
        scales.append(model.get_statistics()["loss_scale"])
    return stepped, snapshots, scales, model.get_statistics()["skipped_steps"]


@pytest.mark.parametrize("mixed,how,culprit", [(True, "after_sync", 1), (False, "after_sync", 2),
                                               (True, "input", 0)])
def test_all_ranks_skip_together_when_one_rank_sees_inf(mixed, how, culprit):
    results = run_ranks(overflow_worker, 3, "shm", args=(mixed, how, culprit))
    first_snapshots = results[0][1]
    for stepped, snapshots, scales, skipped in results:
        assert stepped == [True, False, True, True]
        assert skipped == 1
        assert scales == ([1024.0, 512.0, 512.0, 512.0] if mixed else [1.0] * 4)
        for before, after in zip(snapshots[0], snapshots[1]):
            np.testing.assert_array_equal(before, after)  # the skipped step changed nothing
        for mine, theirs in zip(snapshots[-1], first_snapshots[-1]):
            assert mine.tobytes() == theirs.tobytes()
            assert np.isfinite(mine).all()
