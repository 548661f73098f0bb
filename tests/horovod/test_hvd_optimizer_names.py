"""``hvd.DistributedOptimizer`` matches gradients by parameter name, as Horovod does: a rank
that lists the optimizer's parameters in another order still averages each gradient with the
same parameter's on the other ranks, and ranks that name the parameters differently raise on
every rank instead of averaging one parameter's gradient with another's."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def run(case, variant: str) -> list:
    return run_ranks(case, 2, "shm", timeout=90, args=(variant,), init_kwargs={"timeout": 20.0})


def optimizer_model():
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(5)
    model = MLP([3, 3, 3], activation="tanh")  # two (3, 3) weights, two (3,) biases
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def optimizer_batch(rank: int):
    rng = np.random.default_rng(70 + rank)
    return rng.standard_normal((4, 3)), rng.integers(0, 3, 4)


def optimizer_case(rank: int, world: int, variant: str):
    """Rank 1 lists the optimizer's parameters in reverse ("order"), or names two of them the
    other way round ("names")."""
    import neural_arch.functional as F
    import neural_arch.horovod as hvd
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD
    hvd.init()
    model = optimizer_model()
    params, named = list(model.parameters()), list(model.named_parameters())
    if rank == 1 and variant == "order":
        params = params[::-1]
    if rank == 1 and variant == "names":
        (n0, p0), (n2, p2) = named[0], named[2]
        named[0], named[2] = (n2, p0), (n0, p2)
    opt = hvd.DistributedOptimizer(SGD(params, lr=0.5), named_parameters=named)
    x, y = optimizer_batch(rank)
    F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
    try:
        opt.step()
    except RuntimeError as exc:
        return str(exc)
    finally:
        hvd.shutdown()
    return [p.array.copy() for p in model.parameters()]


def test_optimizer_gradients_are_matched_by_name_whatever_the_parameter_order():
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD
    model = optimizer_model()
    losses = [F.cross_entropy(model(Tensor(x)), Tensor(y))
              for x, y in map(optimizer_batch, range(2))]
    ((losses[0] + losses[1]) * 0.5).backward()
    SGD(model.parameters(), lr=0.5).step()
    for out in run(optimizer_case, "order"):
        assert isinstance(out, list), out
        for got, want in zip(out, model.parameters()):
            np.testing.assert_allclose(got, want.array, rtol=1e-12)


def test_optimizer_parameters_named_differently_on_two_ranks_raise_on_every_rank():
    for out in run(optimizer_case, "names"):
        assert isinstance(out, str), "a step over differently named parameters returned"
        assert "name the parameters of a DistributedOptimizer differently" in out, out
