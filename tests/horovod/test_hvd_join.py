"""``hvd.join()`` with uneven data: ranks with 5, 3 (and 4) batches all finish, and the result
is the documented one. While some ranks have joined, a step's Average is over the ranks that
still train (they divide by the number of contributors), a joined rank keeps its parameters,
and ``join()`` returns the last rank to join, whose parameters are then broadcast to all.
Plain allreduce/allgather/objects from the training ranks are answered by joined ones too."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(240)
ROWS, IN, OUT = 4, 3, 2


def make_model():
    from neural_arch.core import manual_seed
    from neural_arch.models import MLP
    manual_seed(11)
    model = MLP([IN, 5, OUT], activation="tanh")
    for p in model.parameters():
        p.array = p.array.astype(np.float64)
    return model


def rank_batch(rank: int, step: int):
    rng = np.random.default_rng(1000 * rank + step)
    return rng.standard_normal((ROWS, IN)), rng.integers(0, OUT, ROWS)


def reference(counts: list, stop_after: int = None) -> list:
    """One process: step s trains on the batches of the ranks that still have one at s
    (so the average is over the contributing ranks)."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD
    model = make_model()
    opt = SGD(model.parameters(), lr=0.2, momentum=0.5)
    for step in range(max(counts) if stop_after is None else stop_after):
        active = [r for r, n in enumerate(counts) if step < n]
        x = np.concatenate([rank_batch(r, step)[0] for r in active])
        y = np.concatenate([rank_batch(r, step)[1] for r in active])
        F.cross_entropy(model(Tensor(x)), Tensor(y)).backward()
        opt.step()
        opt.zero_grad()
    return [p.array.copy() for p in model.parameters()]


def uneven_case(rank: int, world: int, counts: list) -> dict:
    import neural_arch.functional as F
    import neural_arch.horovod as hvd
    from neural_arch.core import Tensor
    from neural_arch.optim import SGD
    hvd.init()
    model = make_model()
    opt = hvd.DistributedOptimizer(SGD(model.parameters(), lr=0.2, momentum=0.5),
                                   named_parameters=model.named_parameters())
    metrics = []
    for step in range(counts[rank]):
        x, y = rank_batch(rank, step)
        loss = F.cross_entropy(model(Tensor(x)), Tensor(y))
        loss.backward()
        opt.step()
        opt.zero_grad()
        # collectives of the training ranks while others have joined
        metrics.append(float(hvd.allreduce(np.array([1.0]), op=hvd.Sum)[0]))
        metrics.append(hvd.allgather(np.array([rank])).tolist())
        metrics.append(hvd.allgather_object(rank))
    own = [p.array.copy() for p in model.parameters()]
    last = hvd.join()
    hvd.broadcast_parameters(model.named_parameters(), root_rank=last)
    hvd.shutdown()
    return {"last": last, "own": own, "final": [p.array.copy() for p in model.parameters()],
            "metrics": metrics}


@pytest.mark.parametrize("counts", [[5, 3], [5, 3, 4]], ids=["5-3", "5-3-4"])
def test_join_with_uneven_batches_finishes_with_the_documented_result(counts):
    world = len(counts)
    results = run_ranks(uneven_case, world, "shm", timeout=200, args=(counts,))
    expected = reference(counts)
    for rank, out in enumerate(results):
        assert out["last"] == 0  # rank 0 has the most batches: it joined last
        for got, want in zip(out["final"], expected):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        # before the broadcast a joined rank still had the parameters of its last own step
        for got, want in zip(out["own"], reference(counts, counts[rank])):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    for step in range(max(counts)):
        active = [r for r, n in enumerate(counts) if step < n]
        for r in active:
            total, gathered, objects = results[r]["metrics"][3 * step:3 * step + 3]
            assert total == len(active)  # joined ranks add zeros
            assert gathered == active  # and no rows
            assert objects == [r2 if r2 in active else None for r2 in range(world)]
    for a in results[1:]:
        for x, y in zip(a["final"], results[0]["final"]):
            np.testing.assert_array_equal(x, y)


def joined_root_case(rank: int, world: int) -> str:
    import neural_arch.horovod as hvd
    hvd.init()
    try:
        if rank == 1:
            hvd.join()
        else:
            hvd.broadcast(np.zeros(3), root_rank=1)
        return "no error"
    except RuntimeError as exc:
        return str(exc)
    finally:
        hvd.join()  # both ranks: the error left every rank outside join(), in step
        hvd.shutdown()


def test_a_broadcast_from_a_joined_rank_raises_on_every_rank_instead_of_hanging():
    results = run_ranks(joined_root_case, 2, "shm", timeout=120)
    for message in results:
        assert "root_rank 1, which has already called hvd.join()" in message
