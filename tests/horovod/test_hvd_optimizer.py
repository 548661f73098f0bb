"""``hvd.DistributedOptimizer`` on 2 ranks against one process trained on the whole batch:
Average and Sum, fp16 compression (within float16 rounding), ``backward_passes_per_step=2``
(two accumulated micro-batches, one step), ``gradient_predivide_factor``, and Horovod's
clipping pattern (``synchronize()``, clip, ``step()`` inside ``skip_synchronize()``), plus a
parameter that only one rank's loss uses."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(240)
WORLD, STEPS, ROWS, IN, HIDDEN, OUT = 2, 3, 4, 5, 6, 3
BACKEND = "shm"


def make_model():
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(3)
    model = MLP([IN, HIDDEN, OUT], activation="tanh")
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def batch(step: int):
    """Step ``step``'s whole batch: WORLD * ROWS rows, rank r's share rows r::WORLD."""
    rng = np.random.default_rng(500 + step)
    return rng.standard_normal((WORLD * ROWS, IN)), rng.integers(0, OUT, WORLD * ROWS)


def micro_batches(x, y, micro: int):
    """Micro-batch i of every rank is the contiguous block i of its share."""
    return list(zip(np.array_split(x, micro), np.array_split(y, micro)))


def reference(case: dict) -> list:
    """One process on the whole batch; Sum scales the loss by the world size (the sum of the
    ranks' mean losses)."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD, clip_grad_norm_
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    scale = WORLD if case.get("op") == "sum" else 1
    micro = case.get("k", 1)
    for step in range(STEPS):
        x, y = batch(step)
        shares = [micro_batches(x[r::WORLD], y[r::WORLD], micro) for r in range(WORLD)]
        for i in range(micro):
            xm = np.concatenate([shares[r][i][0] for r in range(WORLD)])
            ym = np.concatenate([shares[r][i][1] for r in range(WORLD)])
            (F.cross_entropy(model(Tensor(xm)), Tensor(ym)) * scale).backward()
        if case.get("clip"):
            clip_grad_norm_(model.parameters(), case["clip"])
        opt.step()
        opt.zero_grad()
    return [p.array.copy() for p in model.parameters()]


def train_case(rank: int, world: int, case: dict) -> list:
    import neural_arch.functional as F
    import neural_arch.horovod as hvd
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD, clip_grad_norm_
    hvd.init()
    model = make_model()
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    opt = hvd.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(),
        compression=hvd.Compression.fp16 if case.get("fp16") else hvd.Compression.none,
        backward_passes_per_step=case.get("k", 1),
        op=hvd.Sum if case.get("op") == "sum" else hvd.Average,
        gradient_predivide_factor=case.get("predivide", 1.0))
    for step in range(STEPS):
        x, y = batch(step)
        for xm, ym in micro_batches(x[rank::world], y[rank::world], case.get("k", 1)):
            F.cross_entropy(model(Tensor(xm)), Tensor(ym)).backward()
        if case.get("clip"):
            opt.synchronize()
            clip_grad_norm_(model.parameters(), case["clip"])
            with opt.skip_synchronize():
                opt.step()
        elif case.get("sync_then_step"):
            opt.synchronize()
            opt.synchronize()  # a second call before step() does nothing
            opt.step()  # without skip_synchronize(): still one all-reduce, not two
        else:
            opt.step()
        opt.zero_grad()
    hvd.shutdown()
    return [p.array.copy() for p in model.parameters()]


CASES = {
    "average": {},
    "sum": {"op": "sum"},
    "fp16": {"fp16": True},
    "two_backward_passes": {"k": 2},
    "predivide": {"predivide": 2.0},
    "clipping": {"clip": 0.05},
    "sync_then_step_sum": {"op": "sum", "sync_then_step": True},
}


@pytest.mark.parametrize("name", list(CASES))
def test_distributed_optimizer_equals_one_process_on_the_whole_batch(name):
    case = CASES[name]
    results = run_ranks(train_case, WORLD, BACKEND, timeout=200, args=(case,))
    expected = reference(case)
    for params in results:
        for got, want in zip(params, expected):
            if case.get("fp16"):
                np.testing.assert_allclose(got, want, atol=2e-3)
            else:
                np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for a, b in zip(results[0], results[1]):
        np.testing.assert_array_equal(a, b)  # replicas stay bit-identical


def test_predivide_gives_the_same_parameters_as_plain_average():
    plain = run_ranks(train_case, WORLD, BACKEND, timeout=200, args=({},))
    # dividing by 2 before the sum and multiplying by 2/2 after is exact in floating point
    divided = run_ranks(train_case, WORLD, BACKEND, timeout=200, args=({"predivide": 2.0},))
    for a, b in zip(plain[0], divided[0]):
        np.testing.assert_array_equal(a, b)


def partly_unused_case(rank: int, world: int) -> dict:
    """``extra`` is in rank 0's loss only: every rank still launches it (rank 1 with zeros),
    nobody waits, and it gets rank 0's gradient divided by 2."""
    import neural_arch.horovod as hvd
    from neural_arch.nn import Parameter
    from neural_arch.optim import SGD
    hvd.init()
    used = Parameter(np.ones(3))
    extra = Parameter(np.full(2, 2.0))
    opt = hvd.DistributedOptimizer(SGD([used, extra], lr=1.0),
                                   named_parameters=[("used", used), ("extra", extra)])
    loss = (used * float(rank + 1)).sum()
    if rank == 0:
        loss = loss + (extra * extra).sum()
    loss.backward()
    opt.synchronize()
    grads = {"used": used.grad.array.copy(), "extra": extra.grad.array.copy()}
    with opt.skip_synchronize():
        opt.step()
    hvd.shutdown()
    return grads


def test_a_parameter_without_gradient_on_one_rank_is_averaged_with_zeros():
    results = run_ranks(partly_unused_case, WORLD, BACKEND, timeout=200)
    for grads in results:
        np.testing.assert_array_equal(grads["used"], np.full(3, 1.5))
        np.testing.assert_array_equal(grads["extra"], np.full(2, 2.0))  # (4 + 0) / 2


def optimizer_state_case(rank: int, world: int, root: int) -> dict:
    """Only rank 0 has stepped (Adam's moments and step count exist there alone); after
    broadcast_optimizer_state every rank's state is root's, empty or not."""
    import neural_arch.horovod as hvd
    from neural_arch.optim import Adam
    hvd.init()
    model = make_model()
    opt = Adam(model.parameters(), lr=0.01 * (rank + 1))
    if rank == 0:
        for p in model.parameters():
            p.grad = np.full_like(p.array, 0.5)
        opt.step()
    hvd.broadcast_optimizer_state(opt, root_rank=root)
    state = opt.state_dict()
    hvd.shutdown()
    return state


@pytest.mark.parametrize("root", [0, 1], ids=["root-has-state", "root-is-empty"])
def test_broadcast_optimizer_state_makes_every_rank_equal_to_root(root):
    states = run_ranks(optimizer_state_case, WORLD, BACKEND, timeout=200, args=(root,))
    want = states[root]
    assert len(want["state"]) == (len(list(make_model().parameters())) if root == 0 else 0)
    for state in states:
        assert state["param_groups"] == want["param_groups"]
        assert state["state"].keys() == want["state"].keys()
        for index, entries in want["state"].items():
            for key, value in entries.items():
                np.testing.assert_array_equal(state["state"][index][key], value)
