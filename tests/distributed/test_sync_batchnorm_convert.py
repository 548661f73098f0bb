"""``SyncBatchNorm.convert_sync_batchnorm`` on a model tree, and a DDP step of the converted
ResNet on two processes against one process over the whole batch."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)

PER_RANK, CLASSES = 3, 4


def _resnet(seed: int):
    from neural_arch.core import manual_seed
    from neural_arch.models import resnet8
    manual_seed(seed)
    model = resnet8(num_classes=CLASSES, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for name, buffer in model.named_buffers():  # state that a copy must keep
        if name.endswith("running_mean") or name.endswith("running_var"):
            buffer.array[...] = rng.uniform(0.5, 1.5, buffer.array.shape)
    return model


def test_convert_replaces_every_batchnorm_and_keeps_its_state():
    from neural_arch import nn
    from neural_arch.nn.batchnorm import _BatchNorm
    model = _resnet(seed=3)
    model.layer2.eval()  # a mixed training mode must survive the swap
    before = {name: type(m) for name, m in model.named_modules()}
    params_before = dict(model.named_parameters())
    state_before = {k: np.array(v.array if hasattr(v, "array") else v, copy=True)
                    for k, v in model.state_dict().items()}
    modes_before = {name: m.training for name, m in model.named_modules()}
    group = object()  # stored as given, as torch does; never used outside training
    converted = nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    assert converted is model
    after = dict(converted.named_modules())
    swapped = [name for name, cls in before.items() if issubclass(cls, _BatchNorm)]
    assert len(swapped) == 9, swapped  # resnet8: the stem, 2 in each of 3 blocks, 2 shortcuts
    for name, cls in before.items():
        if name in swapped:
            assert type(after[name]) is nn.SyncBatchNorm, name
            assert after[name].process_group is group
        else:
            assert type(after[name]) is cls, name
        assert after[name].training == modes_before[name], name
    # the same Parameter objects, so an optimizer built before the swap still trains them
    for name, param in converted.named_parameters():
        assert param is params_before[name], name
    state_after = converted.state_dict()
    assert list(state_after) == list(state_before)
    for key, value in state_before.items():
        got = state_after[key]
        np.testing.assert_array_equal(getattr(got, "array", got), value, err_msg=key)


def test_convert_a_lone_batchnorm_returns_the_new_module():
    from neural_arch import nn
    bn = nn.BatchNorm1d(5, eps=1e-3, momentum=None, affine=False)
    bn.eval()
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(bn)
    assert type(sync) is nn.SyncBatchNorm and sync is not bn
    assert (sync.num_features, sync.eps, sync.momentum, sync.affine) == (5, 1e-3, None, False)
    assert sync.weight is None and not sync.training
    assert sync.running_mean is bn.running_mean


def _batch(world_size: int):
    rng = np.random.default_rng(11)
    x = rng.normal(size=(world_size * PER_RANK, 3, 8, 8))
    y = rng.integers(0, CLASSES, size=world_size * PER_RANK)
    return x, y


def ddp_resnet_worker(rank: int, world_size: int):
    import neural_arch.functional as F
    from neural_arch import nn
    from neural_arch.core import Tensor
    from neural_arch.distributed import DistributedDataParallel
    model = nn.SyncBatchNorm.convert_sync_batchnorm(_resnet(seed=5))
    ddp = DistributedDataParallel(model)
    x, y = _batch(world_size)
    rows = slice(rank * PER_RANK, (rank + 1) * PER_RANK)
    loss = F.cross_entropy(ddp(Tensor(x[rows])), Tensor(y[rows]))
    loss.backward()
    ddp.sync_gradients()
    return (float(loss.array), {n: p.grad.array.copy() for n, p in model.named_parameters()},
            {n: np.array(b.array, copy=True) for n, b in model.named_buffers()})


def test_ddp_step_of_the_converted_resnet_equals_one_process():
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    results = run_ranks(ddp_resnet_worker, 2, "shm", timeout=100)
    model = _resnet(seed=5)
    x, y = _batch(2)
    loss = F.cross_entropy(model(Tensor(x)), Tensor(y))
    loss.backward()
    # equal shares: the mean of the ranks' mean losses is the whole batch's mean loss
    assert np.isclose(np.mean([r[0] for r in results]), float(loss.array), rtol=1e-12)
    for name, param in model.named_parameters():
        for _, grads, _ in results:
            np.testing.assert_allclose(grads[name], param.grad, rtol=1e-9, atol=1e-12,
                                       err_msg=name)
    for name, buffer in model.named_buffers():
        for _, _, buffers in results:
            np.testing.assert_allclose(buffers[name], buffer.array, rtol=1e-12, atol=1e-12,
                                       err_msg=name)
