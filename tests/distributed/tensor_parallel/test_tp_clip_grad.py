"""``tensor_parallel.grad_norm`` / ``clip_grad_norm_``: the tensor-parallel GPT's gradient norm
is the dense GPT's, for the 2-norm, another p-norm and the max-norm, with and without sequence
parallelism, at tp = 2 and 4; clipping scales every shard as the dense clip scales the dense
gradient; and what it refuses names the values."""
from __future__ import annotations

import math

import numpy as np
import pytest

from dist_harness import run_ranks
from tp_cases import check_param_grads, close
from tp_gpt_cases import _gpt_pair, _tokens

pytestmark = pytest.mark.timeout(120)
NORM_TYPES = (2.0, 3.0, math.inf)


def _norms_case(rank, size, sequence_parallel):
    from neural_arch.distributed.tensor_parallel import clip_grad_norm_, grad_norm, norm_parameters
    from neural_arch.optim import clip_grad_norm_ as dense_clip_grad_norm_
    dense, parallel = _gpt_pair(21, sequence_parallel=sequence_parallel)
    idx, targets = _tokens(np.random.default_rng(22))
    dense(idx, targets)[1].backward()
    parallel(idx, targets)[1].backward()
    counted, group = norm_parameters(parallel)
    # this rank's share: its shards, and the replicated parameters on rank 0 only
    n_params = len({id(p) for p in parallel.parameters()})
    assert group.size == size and (len(counted) == n_params) == (rank == 0)
    dense_params = list({id(p): p for p in dense.parameters()}.values())
    found = []
    for norm_type in NORM_TYPES:
        want = float(dense_clip_grad_norm_(dense_params, math.inf, norm_type))  # no scaling
        got = grad_norm(parallel.parameters(), norm_type, counted=counted, groups=(group,))
        close(got, want, f"norm {norm_type}", rtol=1e-12, atol=0)
        found.append(got)
    # clipping to a tenth of the norm scales every shard as the dense gradient is scaled
    limit = found[0] / 10
    clipped = clip_grad_norm_(parallel.parameters(), limit, counted=counted, groups=(group,))
    dense_clip_grad_norm_(dense_params, limit)
    close(float(clipped), found[0], "returned norm", rtol=1e-12, atol=0)
    check_param_grads(parallel, dense, rank, size)
    return found


@pytest.mark.parametrize("sequence_parallel", [False, True])
@pytest.mark.parametrize("tp", [2, 4])
def test_the_tensor_parallel_norm_is_the_dense_norm(tp, sequence_parallel):
    results = run_ranks(_norms_case, tp, "shm", timeout=90, args=(sequence_parallel,))
    assert all(r == results[0] for r in results)  # every rank holds the same norms


def _refusals_case(rank, size):
    from neural_arch import distributed as dist
    from neural_arch.distributed.tensor_parallel import (ColumnParallelLinear, grad_norm,
                                                         norm_parameters)
    from neural_arch.nn import Sequential
    errors = []
    pair, alone = dist.new_group([0, 1]), dist.new_group([0])  # every rank makes every group
    if rank == 0:  # layers split over two different groups
        model = Sequential(ColumnParallelLinear(4, 4, group=pair),
                           ColumnParallelLinear(4, 4, group=alone))
        try:
            norm_parameters(model)
        except ValueError as exc:
            errors.append(str(exc))
        try:
            grad_norm(model.parameters(), norm_type=0)
        except ValueError as exc:
            errors.append(str(exc))
    return errors


def test_refusals_name_the_values():
    errors = run_ranks(_refusals_case, 2, "shm", timeout=60)[0]
    assert errors == [
        "norm_parameters: '1' is split over ranks [0], an earlier layer over [0, 1]; one "
        "tensor-parallel group per model",
        "grad_norm: norm_type must be a positive number or math.inf, got 0.0"]


def test_without_groups_it_is_optim_clip_grad_norm_and_keeps_a_nan():
    from neural_arch.distributed.tensor_parallel import clip_grad_norm_, grad_norm
    from neural_arch.nn import Parameter
    from neural_arch.optim import clip_grad_norm_ as dense_clip_grad_norm_
    rng = np.random.default_rng(3)
    params = [Parameter(rng.normal(size=shape)) for shape in ((3, 4), (5,), (0,))]
    for p in params:
        p.grad = rng.normal(size=p.array.shape)
    for norm_type in NORM_TYPES:
        want = float(dense_clip_grad_norm_(params, math.inf, norm_type))
        assert grad_norm(params, norm_type) == pytest.approx(want, rel=1e-12)
    params[1].grad[2] = np.nan
    for norm_type in NORM_TYPES:  # a NaN anywhere makes the norm NaN, the max-norm too
        assert math.isnan(grad_norm(params, norm_type)), norm_type
    assert math.isnan(float(clip_grad_norm_(params, 1.0)))
    assert np.isnan(params[0].grad.array).all()  # scaled by NaN, as PyTorch does
