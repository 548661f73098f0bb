"""The ZeRO optimizers write every parameter in place on every rank (this rank's share by the
local optimizer, the others' by the all-gather), so each step advances every parameter's
version, as torch's in-place writes do: a backward through a graph recorded before the step
raises on every rank instead of using the new weights."""
from __future__ import annotations

import pytest

from ddp_cases import make_model
from dist_harness import run_ranks
from zero_cases import global_batch, loss_on

pytestmark = pytest.mark.timeout(60)

MODIFIED = "modified by an inplace operation"


def versions_worker(rank, world_size):
    from neural_arch.distributed.optim import (ReduceScatterZeroOptimizer,
                                               ZeroRedundancyOptimizer)
    from neural_arch.optim import SGD
    x, y = global_batch("mlp", 0)
    results = {}
    for name, build in (
            ("zero", lambda ps: ZeroRedundancyOptimizer(ps, SGD, lr=0.1)),
            ("zero-bucket-view", lambda ps: ZeroRedundancyOptimizer(
                ps, SGD, lr=0.1, parameters_as_bucket_view=True)),
            ("reduce-scatter", lambda ps: ReduceScatterZeroOptimizer(ps, SGD, lr=0.1))):
        model = make_model(seed=10)
        opt = build(model.parameters())
        loss_on(model, "mlp", x, y).backward()
        before = [p._version for p in model.parameters()]
        loss = loss_on(model, "mlp", x, y)
        opt.step()
        advanced = [p._version > v for p, v in zip(model.parameters(), before)]
        try:
            loss.backward()
            raised = ""
        except RuntimeError as exc:
            raised = str(exc)
        results[name] = (advanced, raised)
    return results


def test_every_parameter_of_every_rank_is_counted_as_written():
    for rank, results in enumerate(run_ranks(versions_worker, 2, "shm")):
        for name, (advanced, raised) in results.items():
            assert all(advanced), f"rank {rank} {name}: parameters advanced {advanced}"
            assert MODIFIED in raised, f"rank {rank} {name}: backward gave {raised!r}"
