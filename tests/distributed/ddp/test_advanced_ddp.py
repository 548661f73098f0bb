"""AdvancedDistributedDataParallel against one process trained on the concatenated batch."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest

import ddp_cases
from conftest import BACKENDS
from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(240)

WINDOWS, PER_MICRO, IN, HIDDEN, OUT = 4, 3, 6, 8, 4
SOCKET_BACKENDS = [b for b in ("shm", "tcp") if b in BACKENDS]


def make_model(seed: int):
    return ddp_cases.make_model(seed, (IN, HIDDEN, HIDDEN, OUT))


def window_batches(world_size: int, steps: int):
    """Per optimizer step: inputs (world * steps * PER_MICRO, IN) and integer labels."""
    rng = np.random.default_rng(99)
    rows = world_size * steps * PER_MICRO
    return (rng.standard_normal((WINDOWS, rows, IN)) * 3.0,
            rng.integers(0, OUT, size=(WINDOWS, rows)))


def reference(world_size: int, steps: int, max_norm):
    """One process, the whole window's batch at once, rank 0's initial weights."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD, clip_grad_norm_
    model = make_model(seed=20)
    opt = SGD(model.parameters(), lr=0.2, momentum=0.9)
    xs, ys = window_batches(world_size, steps)
    norms = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
        norms.append(float(clip_grad_norm_(model.parameters(),
                                           np.inf if max_norm is None else max_norm)))
        opt.step()
    return [p.array.copy() for p in model.parameters()], norms


def advanced_worker(rank: int, world_size: int, steps: int, max_norm):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.optim import SGD
    config = DistributedTrainingConfig(gradient_accumulation_steps=steps, max_grad_norm=max_norm,
                                       bucket_size_mb=0.0005)
    model = AdvancedDistributedDataParallel(make_model(seed=rank + 20), config)
    opt = SGD(model.parameters(), lr=0.2, momentum=0.9)
    xs, ys = window_batches(world_size, steps)
    stepped, unchanged_inside_window = [], True
    for x, y in zip(xs, ys):
        mine_x = np.array_split(x[rank::world_size], steps)
        mine_y = np.array_split(y[rank::world_size], steps)
        before = [p.array.copy() for p in model.parameters()]
        for i, (xm, ym) in enumerate(zip(mine_x, mine_y)):
            stepped.append(model.backward_step(F.cross_entropy(model(Tensor(xm)), Tensor(ym)),
                                               opt))
            if i < steps - 1:
                unchanged_inside_window &= all(np.array_equal(a, p.array) for a, p in
                                               zip(before, model.parameters()))
    return ([p.array.copy() for p in model.module.parameters()], stepped,
            unchanged_inside_window, model.get_statistics())


def check(results, world_size: int, steps: int, max_norm):
    want_params, want_norms = reference(world_size, steps, max_norm)
    first = results[0][0]
    for params, stepped, unchanged, stats in results:
        assert stepped == ([False] * (steps - 1) + [True]) * WINDOWS
        assert unchanged, "the optimizer must not step inside an accumulation window"
        assert stats["step_count"] == WINDOWS and stats["micro_step_count"] == WINDOWS * steps
        assert stats["skipped_steps"] == 0
        for a, b in zip(first, params):
            assert a.tobytes() == b.tobytes(), "ranks must hold bit-identical parameters"
        norms = stats["gradient_norms"]
        assert norms["count"] == WINDOWS
        np.testing.assert_allclose(norms["last"], want_norms[-1], rtol=1e-9)
        np.testing.assert_allclose(norms["max"], max(want_norms), rtol=1e-9)
        np.testing.assert_allclose(norms["mean"], np.mean(want_norms), rtol=1e-9)
    for got, want in zip(first, want_params):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("backend_name", SOCKET_BACKENDS)
@pytest.mark.parametrize("world_size", [2, 3])
def test_accumulation_equals_one_step_on_the_larger_batch(backend_name, world_size):
    steps = 3
    results = run_ranks(advanced_worker, world_size, backend_name, args=(steps, None))
    check(results, world_size, steps, None)


@pytest.mark.parametrize("world_size,steps", [(2, 1), (3, 2)])
def test_clipping_by_global_norm_equals_single_process_clipping(world_size, steps):
    max_norm = 0.25  # below every step's norm here, so each step really clips
    results = run_ranks(advanced_worker, world_size, "shm", args=(steps, max_norm))
    _, want_norms = reference(world_size, steps, max_norm)
    assert min(want_norms) > max_norm
    check(results, world_size, steps, max_norm)


def seed_block_worker(rank: int, world_size: int):
    """The seed's "Advanced Distributed Data Parallel" block, with a model and data added."""
    import contextlib
    import io

    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import Adam
    model = make_model(seed=rank)
    optimizer = Adam(model.parameters(), lr=0.01)
    rng = np.random.default_rng(rank)
    dataloader = [(rng.standard_normal((5, IN)), rng.integers(0, OUT, 5)) for _ in range(8)]

    from neural_arch.distributed.advanced import (
        AdvancedDistributedDataParallel, DistributedTrainingConfig
    )

    config = DistributedTrainingConfig(
        gradient_accumulation_steps=4,
        max_grad_norm=1.0,
        mixed_precision=False,
        profile_communication=True,
        log_gradient_norms=True,
        checkpoint_frequency=100
    )
    ddp_model = AdvancedDistributedDataParallel(model, config)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for batch in dataloader:
            x, y = batch
            loss = F.cross_entropy(ddp_model(Tensor(x)), Tensor(y))
            ddp_model.backward_step(loss, optimizer)
            stats = ddp_model.get_statistics()
            print(f"Step {stats['step_count']}: Gradient norm {stats['gradient_norms']['mean']:.4f}")
    return printed.getvalue(), stats


def test_seed_block_runs_as_printed():
    results = run_ranks(seed_block_worker, 2, "shm")
    for printed, stats in results:
        lines = printed.splitlines()
        assert len(lines) == 8 and lines[0] == "Step 0: Gradient norm 0.0000"
        assert lines[-1].startswith("Step 2: Gradient norm ")
        assert stats["step_count"] == 2 and stats["gradient_norms"]["count"] == 2
        assert 0.0 < stats["gradient_norms"]["mean"] <= stats["gradient_norms"]["max"]
        assert stats["communication"]["gradient_sync"]["count"] == 2
    assert results[0][0] == results[1][0], "both ranks see the same averaged gradients"


def misuse_worker(rank: int, world_size: int):
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    errors = {}
    mixed = AdvancedDistributedDataParallel(make_model(0),
                                            DistributedTrainingConfig(mixed_precision=True))
    x, y = Tensor(np.ones((2, IN), dtype=np.float32)), Tensor(np.array([0, 1]))
    loss = F.cross_entropy(mixed(x), y)
    for name, call in {
        "vector loss": lambda: mixed.backward_step(mixed(x).sum(axis=1), None),
        "not a tensor": lambda: mixed.backward_step(1.0, None),
        "not an optimizer": lambda: mixed.backward_step(loss, object()),
        "not a module": lambda: AdvancedDistributedDataParallel(object()),
        "bad config": lambda: AdvancedDistributedDataParallel(make_model(0), config={"a": 1}),
    }.items():
        try:
            call()
            errors[name] = None
        except (TypeError, ValueError) as exc:
            errors[name] = (type(exc).__name__, str(exc))
    return errors


def test_misuse_raises_errors_naming_the_values():
    errors = run_ranks(misuse_worker, 1, "shm")[0]
    assert errors["vector loss"] == ("ValueError",
                                     "backward_step needs a scalar loss, got shape (2,)")
    assert errors["not a tensor"][0] == "TypeError" and "float" in errors["not a tensor"][1]
    assert errors["not an optimizer"][0] == "TypeError"
    assert errors["not a module"][0] == "TypeError" and "object" in errors["not a module"][1]
    assert errors["bad config"][0] == "TypeError" and "dict" in errors["bad config"][1]


def test_needs_an_initialized_process_group():
    from neural_arch.distributed.advanced import AdvancedDistributedDataParallel
    with pytest.raises(RuntimeError, match="init_process_group"):
        AdvancedDistributedDataParallel(make_model(0))


@pytest.mark.parametrize("field,value,error", [
    ("gradient_accumulation_steps", 0, ValueError),
    ("gradient_accumulation_steps", 2.0, TypeError),
    ("max_grad_norm", -1.0, ValueError),
    ("max_grad_norm", float("nan"), ValueError),
    ("loss_scale", 0.0, ValueError),
    ("loss_scale_window", 0, ValueError),
    ("min_loss_scale", -2.0, ValueError),
    ("bucket_size_mb", 0, ValueError),
    ("checkpoint_frequency", True, TypeError),
    ("checkpoint_dir", "", ValueError),
    ("mixed_precision", "yes", TypeError),
    ("profile_communication", 1, TypeError),
])
def test_config_rejects_bad_values_naming_field_and_value(field, value, error):
    from neural_arch.distributed.advanced import DistributedTrainingConfig
    with pytest.raises(error) as info:
        DistributedTrainingConfig(**{field: value})
    assert field in str(info.value) and repr(value) in str(info.value)


def test_config_defaults_are_the_specified_ones():
    from neural_arch.distributed.advanced import DistributedTrainingConfig
    c = DistributedTrainingConfig()
    assert (c.gradient_accumulation_steps, c.max_grad_norm, c.mixed_precision, c.loss_scale,
            c.dynamic_loss_scaling, c.loss_scale_window, c.min_loss_scale, c.bucket_size_mb,
            c.checkpoint_frequency, c.checkpoint_dir, c.profile_communication,
            c.log_gradient_norms) == (1, None, False, 65536.0, True, 1000, 1.0, 25, 100,
                                      "./checkpoints", False, False)
    with pytest.raises(ValueError, match=r"min_loss_scale \(8.0\) must not exceed loss_scale"):
        DistributedTrainingConfig(loss_scale=4.0, min_loss_scale=8.0)


def test_checkpoint_names_are_reexported_lazily(monkeypatch):
    from neural_arch.distributed import advanced
    assert "DistributedCheckpointManager" in dir(advanced)
    if importlib.util.find_spec("neural_arch.distributed.checkpoint") is not None:
        from neural_arch.distributed import checkpoint
        from neural_arch.distributed.advanced import (DistributedCheckpointManager,
                                                      setup_fault_tolerant_training)
        assert DistributedCheckpointManager is checkpoint.DistributedCheckpointManager
        assert setup_fault_tolerant_training is checkpoint.setup_fault_tolerant_training
    # a lazily exported name whose module is absent reads as a missing attribute
    monkeypatch.setitem(advanced._LAZY, "Ghost", ".no_such_module")
    assert not hasattr(advanced, "Ghost")
    with pytest.raises(ImportError, match="Ghost"):
        exec("from neural_arch.distributed.advanced import Ghost", {})
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        getattr(advanced, "nothing_here")
