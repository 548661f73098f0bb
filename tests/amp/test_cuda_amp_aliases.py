"""``torch.cuda.amp.GradScaler`` and ``torch.cuda.amp.autocast``: torch's deprecated spellings
of ``torch.amp``'s with device "cuda" (a FutureWarning each); without CUDA both are disabled
with a warning, as torch's CPU build does."""
from __future__ import annotations

import warnings

import numpy as np
import pytest

import neural_arch as na
from neural_arch import amp
from neural_arch.backends import get_backend

pytestmark = pytest.mark.timeout(60)

CUDA = get_backend("cupy").is_available()


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def _constructed(factory):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        made = factory()
    return made, [(w.category, str(w.message)) for w in caught]


@pytest.mark.parametrize("enabled", [True, False])
def test_grad_scaler_alias_warns_and_disables_as_torch(torch, enabled):
    ours, ours_warnings = _constructed(lambda: na.cuda.amp.GradScaler(enabled=enabled))
    theirs, theirs_warnings = _constructed(lambda: torch.cuda.amp.GradScaler(enabled=enabled))
    assert isinstance(ours, amp.GradScaler) and ours._device == "cuda"
    assert ours_warnings[0][0] is FutureWarning
    assert "torch.amp.GradScaler('cuda', args...)" in ours_warnings[0][1]
    if not (CUDA or torch.cuda.is_available()):
        assert ours.is_enabled() is theirs.is_enabled() is False
        assert [c for c, _ in ours_warnings] == [c for c, _ in theirs_warnings]
    else:
        assert ours.is_enabled() is enabled


def test_grad_scaler_alias_takes_torchs_arguments(torch):
    with pytest.warns(FutureWarning):
        scaler = na.cuda.amp.GradScaler(init_scale=8.0, growth_factor=3.0, backoff_factor=0.25,
                                        growth_interval=5, enabled=False)
    assert scaler.get_growth_factor() == 3.0 and scaler.get_growth_interval() == 5
    with pytest.raises(ValueError, match="growth_factor must be > 1"), \
            warnings.catch_warnings():
        warnings.simplefilter("ignore")
        na.cuda.amp.GradScaler(growth_factor=0.5)


def test_autocast_alias_warns_and_runs_the_cuda_region(torch):
    ours, ours_warnings = _constructed(lambda: na.cuda.amp.autocast())
    theirs, theirs_warnings = _constructed(lambda: torch.cuda.amp.autocast())
    assert isinstance(ours, amp.autocast) and ours.device == "cuda"
    assert ours_warnings[0][0] is FutureWarning
    assert "torch.amp.autocast('cuda', args...)" in ours_warnings[0][1]
    with ours:
        inside = amp.is_autocast_enabled("cuda")
    with theirs:
        theirs_inside = torch.is_autocast_enabled("cuda")
    assert inside is theirs_inside is (CUDA or torch.cuda.is_available())
    assert not amp.is_autocast_enabled("cuda")
    if not (CUDA or torch.cuda.is_available()):
        assert [c for c, _ in ours_warnings] == [c for c, _ in theirs_warnings]


def test_autocast_alias_as_a_decorator_leaves_cpu_arrays_alone():
    decorate, caught = _constructed(lambda: na.cuda.amp.autocast(dtype=na.float16))
    assert caught[0][0] is FutureWarning

    @decorate
    def product(a, b):
        return a @ b

    x = na.tensor(np.eye(2, dtype=np.float32))
    assert product(x, x).dtype == np.float32  # a CUDA region does not touch host arrays
