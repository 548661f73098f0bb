"""Wrapping policies: which modules become units, where shared parameters go, and nested
units training as the plain model."""
from __future__ import annotations

import functools

import numpy as np
import pytest

from dist_harness import run_ranks
from fsdp_cases import make_model

pytestmark = pytest.mark.timeout(240)


def _units(model, policy):
    from neural_arch.distributed.fsdp.wrap import assign_parameters, unit_prefixes
    prefixes = unit_prefixes(model, policy)
    owned = assign_parameters(model, prefixes)
    return {p: [fqn for fqn, _ in owned[p]] for p in prefixes}


def test_policies_choose_units():
    from neural_arch.distributed.fsdp import (ModuleWrapPolicy, size_based_auto_wrap_policy,
                                              transformer_auto_wrap_policy)
    from neural_arch.models.gpt import Block
    gpt = make_model("gpt", 0)
    block = sum(p.array.size for p in gpt.h[0].parameters())
    by_class = _units(gpt, functools.partial(transformer_auto_wrap_policy,
                                             transformer_layer_cls={Block}))
    assert list(by_class) == ["", "h.0", "h.1"]
    assert by_class[""] == ["wte.weight", "wpe.weight", "ln_f.weight", "ln_f.bias"]
    assert by_class["h.1"][0] == "h.1.ln_1.weight" and len(by_class["h.1"]) == 12
    assert _units(gpt, ModuleWrapPolicy({Block})) == by_class == _units(gpt, {Block})
    # a subtree of at least one block's size: each block (its children are smaller), and
    # ModuleList "h" and the root hold nothing else of that size
    sized = _units(gpt, functools.partial(size_based_auto_wrap_policy, min_num_params=block))
    assert list(sized) == ["", "h.0", "h.1"]
    assert _units(gpt, None) == {"": [n for n, _ in gpt.named_parameters()]}


def test_a_parameter_shared_by_two_units_belongs_to_their_common_ancestor():
    from neural_arch.models.gpt import Block
    gpt = make_model("gpt", 0)
    gpt.h[1].mlp.c_fc.weight = gpt.h[0].mlp.c_fc.weight
    units = _units(gpt, {Block})
    assert "h.0.mlp.c_fc.weight" in units[""]
    assert not any("c_fc.weight" in n for n in units["h.0"] + units["h.1"])


def _nested_model(tied):
    gpt = make_model("gpt", 4)
    if tied:
        gpt.h[1].mlp.c_fc.weight = gpt.h[0].mlp.c_fc.weight
    return gpt


def nested_worker(rank, world_size, strategy, tied):
    from neural_arch.distributed.fsdp import FullyShardedDataParallel
    from neural_arch.models.gpt import Block, FeedForward
    from neural_arch.optim import Adam
    model = FullyShardedDataParallel(_nested_model(tied), sharding_strategy=strategy,
                                     auto_wrap_policy={Block, FeedForward})
    units = [s.unit for s in model.flat_shards()]
    opt = Adam(model.parameters(), lr=0.01)
    tokens = np.random.default_rng(5).integers(0, 11, size=(3, world_size * 2, 8))
    for step in range(3):
        mine = tokens[step, rank * 2:(rank + 1) * 2]
        opt.zero_grad()
        model(mine, mine)[1].backward()
        opt.step()
    return units, model.full_state_dict()


def _nested_reference(world_size, tied):
    from neural_arch.optim import Adam
    model = _nested_model(tied)
    opt = Adam(model.parameters(), lr=0.01)
    tokens = np.random.default_rng(5).integers(0, 11, size=(3, world_size * 2, 8))
    for step in range(3):
        opt.zero_grad()
        model(tokens[step], tokens[step])[1].backward()
        opt.step()
    return model.state_dict()


@pytest.mark.parametrize("strategy,tied", [("FULL_SHARD", False), ("FULL_SHARD", True),
                                           ("SHARD_GRAD_OP", True)])
def test_nested_units_train_as_the_plain_model(strategy, tied):
    want = _nested_reference(2, tied)
    for units, state in run_ranks(nested_worker, 2, "shm", args=(strategy, tied)):
        assert units == ["", "h.0", "h.0.mlp", "h.1", "h.1.mlp"]
        for key in want:
            np.testing.assert_allclose(state[key], want[key], rtol=1e-7, atol=1e-10,
                                       err_msg=key)
