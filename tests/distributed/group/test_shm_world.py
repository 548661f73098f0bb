"""``is_whole_shm_world``: the one answer DDP's shared buckets and ZeRO's shared exchange
take on whether a group is the whole world of an open ``shm`` transport."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from neural_arch.distributed import algorithms
from neural_arch.distributed.ddp import buckets
from neural_arch.distributed.group.shm_world import is_whole_shm_world
from neural_arch.distributed.optim import shared_exchange

pytestmark = pytest.mark.timeout(30)


def group(name="shm", world_size=2, size=2, open_=True):
    collectives = object() if open_ else None
    transport = None if name is None else SimpleNamespace(
        name=name, world_size=world_size, native_collectives=lambda: collectives)
    return SimpleNamespace(transport=transport, size=size, ranks=tuple(range(size)),
                           backend=name)


@pytest.mark.parametrize("pg, whole", [
    (group(), True),
    (group(name="tcp"), False),
    (group(name=None, size=1), False),
    (group(world_size=3, size=2), False),  # a subgroup of the world
    (group(open_=False), False),  # closed: no shared workspace any more
])
def test_the_whole_world_of_an_open_shm_transport(pg, whole):
    assert is_whole_shm_world(pg) is whole


def test_ddp_and_zero_take_the_same_answer(monkeypatch):
    """A group the helper refuses keeps both off shared memory, whatever its transport."""
    monkeypatch.delenv(algorithms.ENV_ALLREDUCE_ALGO, raising=False)
    pg = group()
    for module in (buckets, shared_exchange):
        monkeypatch.setattr(module, "is_whole_shm_world", lambda g: g is not pg)
    monkeypatch.setattr(shared_exchange, "resolve_group", lambda g: g)
    assert "is not the whole world of an shm transport" in buckets.shared_bucket_obstacle(pg, [])
    assert shared_exchange.SharedShardExchange.open([], 0, pg) is None
    assert buckets.shared_bucket_obstacle(group(name="tcp"), []) is None
