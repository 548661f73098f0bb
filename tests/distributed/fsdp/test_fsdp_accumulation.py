"""Gradient accumulation under no_sync(), clipping by the global norm, and prefetching: each
equal to the plain computation."""
from __future__ import annotations

import pytest

from dist_harness import run_ranks
from fsdp_cases import check_states, fsdp_worker, train_reference

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("kind,strategy,world_size", [
    ("gpt", "FULL_SHARD", 2),
    ("mlp", "SHARD_GRAD_OP", 3),
    ("mlp", "NO_SHARD", 2),
])
def test_no_sync_accumulation_equals_the_larger_batch(kind, strategy, world_size):
    micro = 3
    results = run_ranks(fsdp_worker, world_size, "shm",
                        args=(kind, strategy, "adam", True, micro))
    check_states(results, train_reference(kind, world_size, "adam", micro=micro)[0])


@pytest.mark.parametrize("kind,strategy,world_size,norm_type", [
    ("gpt", "FULL_SHARD", 3, 2.0),
    ("mlp", "NO_SHARD", 2, 2.0),
])
def test_clip_grad_norm_equals_the_dense_clip(kind, strategy, world_size, norm_type):
    clip = 0.05
    want, want_norms = train_reference(kind, world_size, "sgd", clip=clip)
    assert min(want_norms) > clip, "the clip must be active for the test to mean anything"
    results = run_ranks(fsdp_worker, world_size, "shm",
                        args=(kind, strategy, "sgd", True, 1, clip))
    for r in results:
        assert r["norms"] == pytest.approx(want_norms, rel=1e-9)
    check_states(results, want)


def test_prefetch_does_not_change_results():
    on = run_ranks(fsdp_worker, 3, "tcp", args=("gpt", "FULL_SHARD", "adam", True, 2))
    off = run_ranks(fsdp_worker, 3, "tcp", args=("gpt", "FULL_SHARD", "adam", True, 2, None,
                                                 False))
    for key, value in on[0]["state"].items():
        assert value.tobytes() == off[0]["state"][key].tobytes(), key
