"""Mixed precision: float16 model and communication, float32 master weights, loss scaling."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(240)


@functools.lru_cache(maxsize=None)
def digits_arrays():
    """``load_digits()``'s (train, test) arrays, loaded once here and passed to the ranks:
    importing scikit-learn takes about 2 s a process."""
    from neural_arch.data import load_digits
    train, test = load_digits()
    return train.arrays, test.arrays


def digits_worker(rank: int, world_size: int, epochs: int, digits):
    """Test accuracy of the same training run in float32 and in mixed precision."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed, no_grad
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    (x_train, y_train), (x_test, y_test) = digits
    accuracy, dtypes = {}, {}
    for mixed in (False, True):
        manual_seed(0)
        model = AdvancedDistributedDataParallel(
            MLP([64, 64, 10]), DistributedTrainingConfig(mixed_precision=mixed))
        opt = SGD(model.parameters(), lr=0.05, momentum=0.9)
        rng, per_rank = np.random.default_rng(0), 32
        for _ in range(epochs):
            order = rng.permutation(len(y_train))
            for start in range(0, len(order) - per_rank * world_size + 1, per_rank * world_size):
                mine = order[start:start + per_rank * world_size][rank::world_size]
                loss = F.cross_entropy(model(Tensor(x_train[mine])), Tensor(y_train[mine]))
                model.backward_step(loss, opt)
        with no_grad():
            predicted = model(Tensor(x_test)).array.argmax(axis=1)
        accuracy[mixed] = float((predicted == y_test).mean())
        dtypes[mixed] = ({str(p.dtype) for p in model.module.parameters()},
                         {str(p.dtype) for p in model.parameters()},
                         model.get_statistics()["communication"])
    return accuracy, dtypes


@pytest.mark.parametrize("world_size", [1, 2])
def test_float16_training_on_digits_matches_float32_accuracy(world_size):
    results = run_ranks(digits_worker, world_size, "shm", args=(8, digits_arrays()),
                        timeout=200)
    accuracy, dtypes = results[0]
    assert accuracy[False] > 0.9, "the float32 run itself must learn to classify digits"
    assert abs(accuracy[True] - accuracy[False]) <= 0.01
    assert dtypes[True][:2] == dtypes[False][:2] == ({"float32"}, {"float32"})
    assert all(r == results[0] for r in results), "every rank ends with the same model"


def probe_worker(rank: int, world_size: int):
    """Records the arrays the model sees during forward, and what gets communicated."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.nn import Linear, Module
    from neural_arch.optim import Adam

    class Probe(Module):
        def __init__(self):
            super().__init__()
            self.fc = Linear(3, 2)
            self.seen = []

        def forward(self, x):
            out = self.fc(x)
            self.seen.append((str(x.dtype), self.fc.weight.array.copy(), str(out.dtype)))
            return out

    from neural_arch.distributed.advanced import CommunicationProfiler, trace_collectives
    wire = CommunicationProfiler()
    manual_seed(0)
    config = DistributedTrainingConfig(mixed_precision=True, profile_communication=True)
    inner = Probe()
    model = AdvancedDistributedDataParallel(inner, config)
    assert [id(p) for p in model.parameters()] == [id(p) for p in inner.parameters()]
    opt = Adam(model.parameters(), lr=0.01)
    rng = np.random.default_rng(rank)
    outputs, masters_before_forward = [], []
    for _ in range(3):
        masters_before_forward.append(inner.fc.weight.array.copy())
        out = model(Tensor(rng.standard_normal((4, 3)).astype(np.float32)))
        outputs.append(str(out.dtype))
        with trace_collectives(wire):
            model.backward_step(F.cross_entropy(out, Tensor(rng.integers(0, 2, 4))), opt)
    return (inner.seen, outputs, masters_before_forward,
            [p.array.copy() for p in model.parameters()],
            {k: v.numpy().copy() for k, v in model.state_dict().items()},
            model.get_statistics()["communication"]["gradient_sync"]["total_bytes"],
            wire.get_statistics())


def test_model_computes_in_float16_and_masters_stay_float32():
    results = run_ranks(probe_worker, 2, "shm")
    seen, outputs, masters_before, masters, state, sync_bytes, wire = results[0]
    assert [(x, w.dtype, out) for x, w, out in seen] == [("float16", np.float16, "float16")] * 3
    for (_, weight, _), master in zip(seen, masters_before):
        assert master.dtype == np.float32
        np.testing.assert_array_equal(weight, master.astype(np.float16))
    assert not np.array_equal(masters_before[0], masters_before[1]), "the masters are trained"
    assert outputs == ["float32"] * 3, "outputs return in float32 so the loss is float32"
    assert all(m.dtype == np.float32 for m in masters)
    assert list(state) == ["module.fc.weight", "module.fc.bias"]
    for value, master in zip(state.values(), masters):
        assert value.dtype == np.float32
        np.testing.assert_array_equal(value, master)
    # 3 syncs of the 2x3 + 2 gradients, sent as float16: half the bytes of float32; on the
    # wire each step is one float16 bucket (averaged in DDP's shared buckets on shm) and the
    # int32 overflow flag
    assert sync_bytes == 3 * 8 * 2
    buckets, flags = wire["shared_bucket_all_reduce"], wire["all_reduce"]
    assert buckets["count"] == 3 and buckets["total_bytes"] == 3 * 8 * 2
    assert flags["count"] == 3 and flags["total_bytes"] == 3 * 4
    for other in results[1:]:
        for a, b in zip(other[3], masters):
            assert a.tobytes() == b.tobytes()


def first_step_worker(rank: int, world_size: int, init_scale: float):
    """One optimizer step; returns the masters' change and the scaler's history."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    manual_seed(0)
    model = AdvancedDistributedDataParallel(
        MLP([8, 16, 4]), DistributedTrainingConfig(mixed_precision=True, loss_scale=init_scale,
                                                   loss_scale_window=2))
    opt = SGD(model.parameters(), lr=1.0)
    rng = np.random.default_rng(7)
    x = rng.standard_normal((world_size * 6, 8)).astype(np.float32) * 4.0
    y = rng.integers(0, 4, world_size * 6)
    start = [p.array.copy() for p in model.parameters()]
    attempts = []
    while model.step_count == 0:
        loss = F.cross_entropy(model(Tensor(x[rank::world_size])), Tensor(y[rank::world_size]))
        attempts.append((model.backward_step(loss, opt),
                         model.get_statistics()["loss_scale"],
                         [p.array.copy() for p in model.parameters()]))
    return start, attempts, x, y


@pytest.mark.parametrize("world_size", [1, 2])
def test_overflowing_scale_backs_off_then_the_step_matches_float32(world_size):
    init_scale = 2.0 ** 30  # the float16 gradients overflow until the scale has come down
    start, attempts, x, y = run_ranks(first_step_worker, world_size, "shm",
                                      args=(init_scale,))[0]
    skipped = len(attempts) - 1
    assert skipped >= 1
    for i, (stepped, scale, params) in enumerate(attempts):
        assert stepped == (i == skipped)
        assert scale == init_scale * 0.5 ** (i + 1 if i < skipped else skipped)
        if i < skipped:
            for a, b in zip(params, start):
                np.testing.assert_array_equal(a, b)
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.models import MLP
    reference = MLP([8, 16, 4])
    for p, value in zip(reference.parameters(), start):
        p.array = value.copy()
    F.cross_entropy(reference(Tensor(x)), Tensor(y)).backward()  # float32, whole batch
    for p, got in zip(reference.parameters(), attempts[-1][2]):
        want = p.array - p.grad.array
        assert np.abs(got - want).max() <= 2e-3 * max(1.0, np.abs(p.grad.array).max())


def resume_worker(rank: int, world_size: int, directory: str, resume: bool):
    """Train 6 steps straight, or 3 steps, checkpoint, rebuild everything, load, 3 more."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedCheckpointManager,
                                                  DistributedTrainingConfig)
    from neural_arch.models import MLP
    from neural_arch.optim import Adam

    def build():
        manual_seed(0)
        config = DistributedTrainingConfig(mixed_precision=True, loss_scale=2.0 ** 20,
                                           loss_scale_window=2)
        model = AdvancedDistributedDataParallel(MLP([6, 12, 3]), config)
        return model, Adam(model.parameters(), lr=0.01)
    data = np.random.default_rng(rank)
    batches = [(data.standard_normal((5, 6)).astype(np.float32), data.integers(0, 3, 5))
               for _ in range(6)]
    model, opt = build()
    manager = DistributedCheckpointManager(directory, max_checkpoints=2)
    for step, (x, y) in enumerate(batches):
        if resume and step == 3:
            manager.save_checkpoint(model, opt, epoch=0, step=2, loss=0.0,
                                    loss_scaler=model.scaler)
            model, opt = build()
            manager.load_checkpoint(model, opt, loss_scaler=model.scaler)
        model.backward_step(F.cross_entropy(model(Tensor(x)), Tensor(y)), opt)
    return [p.array.copy() for p in model.parameters()], model.scaler.state_dict()


def test_mixed_precision_resumes_exactly_from_a_checkpoint(tmp_path):
    pytest.importorskip("neural_arch.distributed.checkpoint")
    straight = run_ranks(resume_worker, 2, "shm", args=(str(tmp_path / "a"), False))
    resumed = run_ranks(resume_worker, 2, "shm", args=(str(tmp_path / "b"), True))
    assert straight[0][1]["scale"] != 2.0 ** 20, "the scale changed, so its state matters"
    for (params_a, scaler_a), (params_b, scaler_b) in zip(straight, resumed):
        assert scaler_a == scaler_b
        for a, b in zip(params_a, params_b):
            assert a.dtype == np.float32
            np.testing.assert_array_equal(a, b)
