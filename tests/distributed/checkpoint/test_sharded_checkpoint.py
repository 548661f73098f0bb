"""Sharded checkpoints through the manager, on a stand-in sharded model (flat vectors split
1/N per rank, as FullyShardedDataParallel keeps them): each rank writes only its own piece,
and a checkpoint saved at one world size loads at another with every element in its place."""
from __future__ import annotations

import os
from types import SimpleNamespace

import numpy as np
import pytest

from dist_harness import RankFailed, run_ranks

pytestmark = pytest.mark.timeout(120)
SIZES = {"a": 10, "b": 3, "c": 1}  # fewer elements than ranks too


def _full(name: str, version: int) -> np.ndarray:
    """The full flat ``name`` after ``version`` updates (what every world size must agree on)."""
    return np.arange(SIZES[name], dtype=np.float64) * 10.0 ** version + ord(name)


class StandInSharded:
    """The duck type the checkpoint layer reads: ``flat_shards()`` and ``named_buffers()``."""

    def __init__(self, rank: int, world_size: int, version: int, replicated: bool = False
                 ) -> None:
        from neural_arch.nn import Parameter
        self.flats = []
        for name, numel in SIZES.items():
            padded = -(-numel // world_size) * world_size
            size = padded if replicated else padded // world_size  # NO_SHARD: whole replicas
            start = 0 if replicated else rank * size
            full = np.zeros(padded)
            full[:numel] = _full(name, version)
            shard = Parameter(full[start:start + size].copy())
            self.flats.append(SimpleNamespace(unit=name, shard=shard, numel=numel,
                                              padded_numel=padded))

    def flat_shards(self):
        return self.flats

    def named_buffers(self):
        return iter(())

    def parameters(self):
        return [f.shard for f in self.flats]


def _stepped_optimizer(model, version: int):
    """SGD with momentum whose buffers hold a known function of the full flat."""
    from neural_arch.optim import SGD
    optimizer = SGD(model.parameters(), lr=0.1, momentum=0.9)
    for flat in model.flats:
        optimizer.state[flat.shard]["momentum_buffer"] = -flat.shard.array * 2 + version
    return optimizer


def _save(rank, world_size, directory, replicated=False):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model = StandInSharded(rank, world_size, version=1, replicated=replicated)
    optimizer = _stepped_optimizer(model, version=1)
    return DistributedCheckpointManager(directory).save_checkpoint(model, optimizer, 0, 3, 0.5)


def _load(rank, world_size, directory, replicated=False):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model = StandInSharded(rank, world_size, version=0, replicated=replicated)  # overwritten
    optimizer = _stepped_optimizer(model, version=0)
    state = DistributedCheckpointManager(directory).load_checkpoint(model, optimizer)
    return (state["step"], state["world_size"],
            {f.unit: f.shard.array.copy() for f in model.flats},
            {f.unit: optimizer.state[f.shard]["momentum_buffer"].copy() for f in model.flats})


def _expected_shard(name: str, rank: int, world_size: int, values: np.ndarray) -> np.ndarray:
    numel = SIZES[name]
    size = -(-numel // world_size)
    full = np.zeros(size * world_size)
    full[:numel] = values
    return full[rank * size:(rank + 1) * size]


@pytest.mark.parametrize("saved_at, loaded_at", [(4, 2), (4, 1), (2, 3), (1, 4), (3, 3)])
def test_saved_shards_load_at_any_world_size(tmp_path, saved_at, loaded_at):
    paths = run_ranks(_save, saved_at, "shm", args=(str(tmp_path),))
    assert len(set(paths)) == 1
    written = sorted(f for f in os.listdir(paths[0]) if ".shard" in f)
    assert written == sorted(f"{kind}.shard{r}.safetensors" for r in range(saved_at)
                             for kind in ("model", "optimizer"))
    assert "model.safetensors" in os.listdir(paths[0])  # buffers (none here), written by rank 0
    results = run_ranks(_load, loaded_at, "shm", args=(str(tmp_path),))
    for rank, (step, world, shards, momenta) in enumerate(results):
        assert (step, world) == (3, saved_at)
        for name in SIZES:
            values = _full(name, 1)
            np.testing.assert_array_equal(shards[name],
                                          _expected_shard(name, rank, loaded_at, values))
            expected_momentum = np.zeros(SIZES[name])
            expected_momentum[:] = -values * 2 + 1
            want = _expected_shard(name, rank, loaded_at, expected_momentum)
            np.testing.assert_array_equal(momenta[name], want)  # padding is zero, not stale


@pytest.mark.parametrize("saved_replicated", [True, False])
def test_replicas_are_written_once_and_load_as_shards_or_replicas(tmp_path, saved_replicated):
    from safetensors.numpy import load_file
    path = run_ranks(_save, 3, "shm", args=(str(tmp_path), saved_replicated))[0]
    sizes = [sum(a.size for a in load_file(os.path.join(path, f"model.shard{r}.safetensors"))
                 .values()) for r in range(3)]
    assert sum(sizes) == sum(SIZES.values())  # every element once, no padding
    if saved_replicated:
        assert sizes[1:] == [0, 0]
    results = run_ranks(_load, 2, "shm", args=(str(tmp_path), not saved_replicated))
    for rank, (_, _, shards, _) in enumerate(results):
        for name in SIZES:
            want = (_expected_shard(name, 0, 1, _full(name, 1)) if not saved_replicated
                    else _expected_shard(name, rank, 2, _full(name, 1)))
            if not saved_replicated:  # loaded as replicas: the whole padded flat
                want = np.concatenate([want, np.zeros(-(-SIZES[name] // 2) * 2 - want.size)])
            np.testing.assert_array_equal(shards[name], want)


def test_each_rank_reads_only_the_pieces_it_needs(tmp_path):
    from neural_arch.distributed.checkpoint import sharded
    def layout(world):
        return [{"name": n, "numel": k, "padded": -(-k // world) * world, "size": -(-k // world)}
                for n, k in SIZES.items()]
    needed = sharded.files_needed(layout(4), 4, rank=0, world_size=2, now=layout(2),
                                  optimizer=False)
    # rank 0 of 2 holds a[0:5], b[0:2], c[0:1]: saved ranks 0 and 1 (a[0:3], a[3:6]) suffice
    assert needed == {"model.shard0.safetensors", "model.shard1.safetensors"}


def test_damaged_shard_is_named(tmp_path):
    from neural_arch.distributed.checkpoint import CheckpointCorruptError
    path = run_ranks(_save, 2, "shm", args=(str(tmp_path),))[0]
    victim = os.path.join(path, "model.shard1.safetensors")
    with open(victim, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"\xff\xff\xff")
    with pytest.raises(RankFailed) as failed:
        run_ranks(_load_named, 2, "shm", args=(path,))
    assert "model.shard1.safetensors" in str(failed.value)
    assert CheckpointCorruptError.__name__ in str(failed.value)


def _load_named(rank, world_size, path):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    model = StandInSharded(rank, world_size, version=0)
    DistributedCheckpointManager(os.path.dirname(path)).load_checkpoint(model, path=path)


def _load_dense(rank, world_size, directory):
    from neural_arch.distributed.checkpoint import DistributedCheckpointManager
    from neural_arch.models import MLP
    DistributedCheckpointManager(directory).load_checkpoint(MLP([2, 2]))


def test_sharded_checkpoint_into_a_plain_model_is_refused(tmp_path):
    run_ranks(_save, 2, "shm", args=(str(tmp_path),))
    with pytest.raises(RankFailed, match="holds a sharded model"):
        run_ranks(_load_dense, 1, "shm", args=(str(tmp_path),))
