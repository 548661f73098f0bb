"""DistributedDataParallel(gradient_as_bucket_view=True): the gradients are views of the
private buckets (no second copy) and training is unchanged; and DDP on a subgroup that does
not hold global rank 0 starts from the subgroup's first rank."""
from __future__ import annotations

import numpy as np
import pytest

from ddp_cases import check_against_reference, train_ddp, train_reference
from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(120)


def views_worker(rank: int, world_size: int, micro: int, auto_sync: bool):
    from ddp_cases import make_model, make_optimizer
    from neural_arch.distributed import DistributedDataParallel
    model = DistributedDataParallel(make_model(seed=rank + 10), bucket_size_mb=0.0005,
                                    auto_sync=auto_sync, gradient_as_bucket_view=True)
    opt = make_optimizer("sgd", model.parameters())
    opt.zero_grad = lambda: model.zero_grad(set_to_none=False)  # keep the views, as torch users do
    result = train_ddp(model, opt, rank, world_size, micro)
    flats = [b.flat for b in model._buckets]
    views = all(any(np.shares_memory(p.grad.array, f) for f in flats) for p in model.parameters())
    return result, views, model.shared_buckets


@pytest.mark.parametrize("micro, auto_sync", [(1, True), (2, True), (1, False)])
def test_gradients_are_views_of_the_buckets_and_training_is_unchanged(backend, micro,
                                                                        auto_sync):
    results = run_ranks(views_worker, 2, backend, args=(micro, auto_sync))
    check_against_reference([r for r, _, _ in results], train_reference(2, "sgd", micro=micro))
    assert all(views and not shared for _, views, shared in results)


def shared_and_views(rank: int, world_size: int):
    from ddp_cases import make_model
    from neural_arch.distributed import DistributedDataParallel
    DistributedDataParallel(make_model(seed=1), shared_buckets=True,
                            gradient_as_bucket_view=True)


def test_views_and_shared_buckets_are_refused_together():
    with pytest.raises(RankFailed, match="gradient_as_bucket_view=True"):
        run_ranks(shared_and_views, 2, "shm")


def subgroup_worker(rank: int, world_size: int):
    from ddp_cases import make_model
    from neural_arch import distributed as dist
    group = dist.new_group([1, 2])
    if rank == 0:
        return None
    model = dist.DistributedDataParallel(make_model(seed=rank + 10), group=group)
    return [p.array.copy() for p in model.module.parameters()]


def test_subgroup_without_rank_0_starts_from_its_first_rank():
    from ddp_cases import make_model
    results = run_ranks(subgroup_worker, 3, "shm")
    want = [p.array for p in make_model(seed=11).parameters()]  # global rank 1's weights
    for params in results[1:]:
        for got, expected in zip(params, want):
            np.testing.assert_array_equal(got, expected)
