"""Every sharding strategy trains exactly as one process on the concatenated batch (and as
DDP): the full parameters gathered from the shards match after several steps, bit-identical
on every rank."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks
from fsdp_cases import check_states, ddp_worker, fsdp_worker, train_reference

pytestmark = pytest.mark.timeout(240)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("strategy,world_size,optimizer,wrap", [
    ("FULL_SHARD", 2, "sgd", True),
    ("SHARD_GRAD_OP", 3, "adamw", True),
])
def test_mlp_equals_single_process(backend, strategy, world_size, optimizer, wrap):
    results = run_ranks(fsdp_worker, world_size, backend,
                        args=("mlp", strategy, optimizer, wrap))
    check_states(results, train_reference("mlp", world_size, optimizer)[0])


@pytest.mark.parametrize("strategy,world_size,optimizer,wrap", [
    ("FULL_SHARD", 3, "adam", False),   # one unit; 103 parameters do not divide by 3
    ("NO_SHARD", 2, "sgd", True),
    ("FULL_SHARD", 1, "adamw", True),
])
def test_mlp_strategies_and_world_sizes(strategy, world_size, optimizer, wrap):
    results = run_ranks(fsdp_worker, world_size, "shm", args=("mlp", strategy, optimizer, wrap))
    check_states(results, train_reference("mlp", world_size, optimizer)[0])


def test_units_smaller_than_the_world():
    """A unit of 2 parameters over 4 ranks: two ranks hold only padding."""
    results = run_ranks(fsdp_worker, 4, "shm", args=("tiny", "FULL_SHARD", "adam", True))
    assert [r["shards"] for r in results] == [[2, 1, 2]] * 4  # 8, 2 and 8 padded to 4 shards
    check_states(results, train_reference("tiny", 4, "adam")[0])


@pytest.mark.parametrize("strategy,world_size,optimizer,wrap", [
    ("FULL_SHARD", 2, "adamw", True),
    ("SHARD_GRAD_OP", 3, "sgd", True),
    ("NO_SHARD", 2, "adam", False),
])
def test_gpt_equals_single_process(strategy, world_size, optimizer, wrap):
    results = run_ranks(fsdp_worker, world_size, "shm", args=("gpt", strategy, optimizer, wrap))
    check_states(results, train_reference("gpt", world_size, optimizer)[0])


def test_gpt_full_shard_equals_ddp():
    fsdp = run_ranks(fsdp_worker, 2, "tcp", args=("gpt", "FULL_SHARD", "adam", True))
    ddp = run_ranks(ddp_worker, 2, "tcp", args=("gpt", "adam"))
    for key, want in ddp[0].items():
        np.testing.assert_allclose(fsdp[0]["state"][key], want, rtol=1e-7, atol=1e-10,
                                   err_msg=key)


def test_reference_is_sensitive():
    """The comparison can fail: another optimizer gives other parameters."""
    results = run_ranks(fsdp_worker, 2, "shm", args=("mlp", "FULL_SHARD", "sgd", True))
    with pytest.raises(AssertionError):
        check_states(results, train_reference("mlp", 2, "adam")[0])
