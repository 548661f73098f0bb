"""DDP's sync bookkeeping in this process, on a one-rank group (the checks are the same as
with many ranks; the averaging itself is tested with real processes in test_ddp_sync_modes)."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from neural_arch import distributed as dist

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("one_rank_group")]




def step(model, x, y):
    import neural_arch.functional as F
    F.cross_entropy(model(x), y).backward()


def data():
    from neural_arch.core import Tensor
    rng = np.random.default_rng(0)
    return Tensor(rng.standard_normal((4, 3))), Tensor(rng.integers(0, 2, 4))


def mlp():
    from neural_arch.models import MLP
    return MLP([3, 5, 2])


def test_explicit_mode_allows_what_pytorch_allows_and_names_a_forgotten_sync():
    x, y = data()
    model = dist.DistributedDataParallel(mlp(), auto_sync=False)
    with model.no_sync():  # local accumulation needs no sync
        step(model, x, y)
        step(model, x, y)
    step(model, x, y)
    model.sync_gradients()
    step(model, x, y)
    with pytest.raises(RuntimeError, match=r"forward\(\) after a backward\(\) whose gradients "
                                           r"\(4 parameters, the first '2\.bias'\) were never "
                                           r"averaged over the 1 ranks"):
        model(x)
    with pytest.raises(RuntimeError, match=r"a second backward\(\) .*sync_gradients\(\)"):
        step(model.module, x, y)
    with pytest.raises(RuntimeError, match="never averaged"):  # until it is synced
        with model.no_sync():
            step(model.module, x, y)
    model.sync_gradients()
    step(model, x, y)
    model.sync_gradients()
    # the bookkeeping adds nothing to what a checkpoint of the wrapper holds
    assert sorted(model.state_dict()) == sorted(f"module.{k}" for k in model.module.state_dict())


def test_default_mode_needs_no_sync_and_accepts_one():
    x, y = data()
    model = dist.DistributedDataParallel(mlp())
    for _ in range(3):
        step(model, x, y)  # no sync_gradients(): nothing to detect in automatic mode
    model.sync_gradients()
    model.sync_gradients()
    assert model.auto_sync is True


def test_a_dropped_wrapper_is_freed_and_stops_watching_its_module():
    x, y = data()
    for auto_sync in (True, False):
        net = mlp()
        wrapper = weakref.ref(dist.DistributedDataParallel(net, auto_sync=auto_sync))
        gc.collect()
        assert wrapper() is None, f"auto_sync={auto_sync}: the hooks keep the wrapper alive"
        step(net, x, y)
        step(net, x, y)  # neither a sync nor a check of the dropped wrapper runs
        model = dist.DistributedDataParallel(net, auto_sync=auto_sync)
        step(model, x, y)
        model.sync_gradients()
        assert all(len(p._meta["post_hooks"]) == 1 for p in net.parameters())
