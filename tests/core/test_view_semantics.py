"""``Tensor.view`` as torch's: a view shares memory (and the version counter) with its
source; data that no view can show raises RuntimeError pointing at ``.reshape(...)``, where
``reshape`` copies."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.core import Tensor

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.timeout(30)


def test_view_of_contiguous_data_shares_memory_and_gradients_match_torch():
    data = np.arange(12.0).reshape(3, 4)
    x, tx = Tensor(data.copy(), requires_grad=True), torch.tensor(data, requires_grad=True)
    for t in (x, tx):
        (t.view(4, 3).view(-1) * np.arange(12.0)).sum().backward() if t is x else \
            (t.view(4, 3).view(-1) * torch.arange(12.0)).sum().backward()
    np.testing.assert_array_equal(x.grad, tx.grad.numpy())
    plain = Tensor(data.copy())
    v = plain.view(2, 6)
    v[0, 0] = 100.0
    assert plain.array[0, 0] == 100.0 and plain._version == 1


def test_view_of_non_viewable_data_raises_like_torch_and_reshape_copies():
    data = np.arange(12.0).reshape(3, 4)
    ours, theirs = Tensor(data).transpose(0, 1), torch.tensor(data).t()
    with pytest.raises(RuntimeError, match=r"view size is not compatible.*Use \.reshape\(\.\.\.\)"):
        theirs.view(12)
    with pytest.raises(RuntimeError, match=r"view size is not compatible.*Use \.reshape\(\.\.\.\)"):
        ours.view(12)
    np.testing.assert_array_equal(ours.reshape(12).numpy(), theirs.reshape(12).numpy())
    assert ours.view(4, 3).shape == (4, 3)  # the same shape is always a view
    assert Tensor(np.zeros((0, 3))).T.view(0).shape == (0,)
