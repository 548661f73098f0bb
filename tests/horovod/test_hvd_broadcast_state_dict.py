"""``hvd.broadcast_parameters(model.state_dict(), root_rank=0)``, the first line of every
Horovod example, on real processes: the non-root ranks start with other weights (and buffers)
and end with the root's, as with ``named_parameters()``; ``broadcast_optimizer_state`` still
makes the optimizer states equal."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def make_model(rank: int):
    from neural_arch import nn
    from neural_arch.core import manual_seed
    manual_seed(100 + rank)  # every rank starts from different weights
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    model[1].running_mean.array[...] = rank  # a buffer that differs too
    return model


def state_of(model) -> dict:
    return {k: np.array(v.numpy(), copy=True) for k, v in model.state_dict().items()}


def broadcast_case(rank: int, world: int, root: int) -> dict:
    import neural_arch.horovod as hvd
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD
    hvd.init()
    model = make_model(rank)
    before = state_of(model)
    hvd.broadcast_parameters(model.state_dict(), root_rank=root)
    after_state_dict = state_of(model)
    other = make_model(rank + 10)
    hvd.broadcast_parameters(other.named_parameters(), root_rank=root)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    if rank == root:  # only the root has momentum buffers before the broadcast
        model(Tensor(np.ones((2, 3)))).sum().backward()
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    momenta = [np.array(s["momentum_buffer"]) for s in opt.state_dict()["state"].values()]
    hvd.shutdown()
    return {"before": before, "after": after_state_dict,
            "named": [p.array.copy() for p in other.parameters()], "momenta": momenta}


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_broadcast_of_state_dict_sets_every_rank_to_the_root(backend, world):
    root = world - 1
    results = run_ranks(broadcast_case, world, backend, args=(root,), timeout=100)
    expected = results[root]["after"]
    for key, value in results[root]["before"].items():  # the root keeps its own state
        np.testing.assert_array_equal(expected[key], value)
    for rank, result in enumerate(results):
        if rank != root:
            assert any(not np.array_equal(result["before"][k], expected[k])
                       for k in expected), "the ranks should start from different weights"
        for key in expected:
            np.testing.assert_array_equal(result["after"][key], expected[key], err_msg=key)
        for ours, roots in zip(result["named"], results[root]["named"]):
            np.testing.assert_array_equal(ours, roots)
        assert len(result["momenta"]) == len(results[root]["momenta"]) > 0
        for ours, roots in zip(result["momenta"], results[root]["momenta"]):
            np.testing.assert_array_equal(ours, roots)
