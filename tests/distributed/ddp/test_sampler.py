"""DistributedSampler against a plain-Python restatement of PyTorch's algorithm (and torch itself)."""
import math

import numpy as np
import pytest

from neural_arch.distributed.ddp.sampler import DistributedSampler

pytestmark = pytest.mark.timeout(60)


def reference_indices(n, p, rank, drop_last, order):
    """PyTorch's DistributedSampler.__iter__ written out with lists."""
    indices = list(order)
    if drop_last and n % p != 0:
        num_samples = math.ceil((n - p) / p)
    else:
        num_samples = math.ceil(n / p)
    total = num_samples * p
    if not drop_last:
        pad = total - len(indices)
        if pad <= len(indices):
            indices += indices[:pad]
        else:
            indices += (indices * math.ceil(pad / len(indices)))[:pad]
    else:
        indices = indices[:total]
    return indices[rank:total:p]


@pytest.mark.parametrize("n", [0, 1, 2, 5, 10, 17, 100])
@pytest.mark.parametrize("p", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_order_without_shuffle_matches_reference(n, p, drop_last):
    for rank in range(p):
        s = DistributedSampler(n, num_replicas=p, rank=rank, shuffle=False, drop_last=drop_last)
        got = list(s)
        if n == 0 and not drop_last:
            assert got == []
            continue
        assert got == reference_indices(n, p, rank, drop_last, range(n))
        assert len(s) == len(got)


@pytest.mark.parametrize("n,p", [(10, 3), (100, 4), (7, 2), (64, 4)])
def test_shuffle_partitions_disjointly_with_equal_sizes(n, p):
    shares = [list(DistributedSampler(n, p, r, shuffle=True, seed=3, drop_last=True)) for r in range(p)]
    sizes = {len(s) for s in shares}
    assert sizes == {n // p}
    flat = [i for s in shares for i in s]
    assert len(flat) == len(set(flat)), "ranks must not share indices with drop_last"
    assert all(0 <= i < n for i in flat)
    padded = [list(DistributedSampler(n, p, r, shuffle=True, seed=3)) for r in range(p)]
    covered = {i for s in padded for i in s}
    assert covered == set(range(n)), "without drop_last every index is seen"


def test_set_epoch_changes_order_and_is_deterministic():
    a = DistributedSampler(50, 2, 0, seed=1)
    b = DistributedSampler(50, 2, 0, seed=1)
    first = list(a)
    a.set_epoch(1)
    second = list(a)
    assert first != second
    b.set_epoch(1)
    assert list(b) == second
    # The shuffle is the seeded permutation, split by stride.
    perm = np.random.default_rng(1 + 1).permutation(50)
    assert second == reference_indices(50, 2, 0, False, perm.tolist())


def test_accepts_dataset_and_keyword_forms():
    data = list(range(9))
    assert len(DistributedSampler(data, 2, 1, shuffle=False)) == 5
    assert list(DistributedSampler(dataset_size=9, num_replicas=3, rank=2, shuffle=False)) == [2, 5, 8]


def test_bad_arguments_raise_with_values():
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        DistributedSampler(10, num_replicas=2, rank=2)
    with pytest.raises(ValueError, match="num_replicas must be >= 1, got 0"):
        DistributedSampler(10, num_replicas=0, rank=0)
    with pytest.raises(TypeError, match="dataset size"):
        DistributedSampler(3.5, num_replicas=1, rank=0)


def test_state_dict_round_trip():
    s = DistributedSampler(20, 2, 0)
    s.set_epoch(4)
    t = DistributedSampler(20, 2, 0)
    t.load_state_dict(s.state_dict())
    assert list(t) == list(s)
    with pytest.raises(ValueError, match="20 items"):
        DistributedSampler(21, 2, 0).load_state_dict(s.state_dict())


def test_matches_torch_without_shuffle():
    torch = pytest.importorskip("torch")
    from torch.utils.data.distributed import DistributedSampler as TorchSampler
    for n, p in [(10, 3), (2, 4), (17, 4)]:
        for drop_last in (False, True):
            for r in range(p):
                ours = list(DistributedSampler(n, p, r, shuffle=False, drop_last=drop_last))
                theirs = list(TorchSampler(range(n), p, r, shuffle=False, drop_last=drop_last))
                assert ours == theirs
