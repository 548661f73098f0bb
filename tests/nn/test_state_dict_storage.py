"""``Module.state_dict()`` as torch has it: an OrderedDict of tensors that share storage with
the parameters and persistent buffers (``keep_vars=True``: the Parameter objects themselves),
so writing into an entry in place changes the module; ``destination`` and ``prefix``; loading
and saving accept tensors and arrays; callers that keep snapshots take copies."""
from __future__ import annotations

from collections import OrderedDict

import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn
from neural_arch.core import Tensor

pytestmark = pytest.mark.timeout(30)


class WithBuffers(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(3, 2)
        self.register_buffer("scale", Tensor(np.ones(2, dtype=np.float32)))
        self.register_buffer("steps", np.zeros((), dtype=np.int64))  # an array buffer
        self.register_buffer("scratch", np.zeros(4), persistent=False)


def test_entries_are_detached_tensors_sharing_storage():
    model = WithBuffers()
    sd = model.state_dict()
    assert isinstance(sd, OrderedDict)
    assert list(sd) == ["scale", "steps", "lin.weight", "lin.bias"]  # torch's order
    for key, value in sd.items():
        assert type(value) is Tensor, key
        assert not value.requires_grad and value.is_leaf
    assert np.shares_memory(sd["lin.weight"].array, model.lin.weight.array)
    sd["lin.weight"].copy_(np.full((2, 3), 7.0))
    sd["lin.bias"][...] = 3.0
    sd["scale"].mul_(2.0)
    sd["steps"].add_(5)
    np.testing.assert_array_equal(model.lin.weight.array, np.full((2, 3), 7.0))
    np.testing.assert_array_equal(model.lin.bias.array, [3.0, 3.0])
    np.testing.assert_array_equal(model.scale.array, [2.0, 2.0])
    assert int(model.steps) == 5


def test_keep_vars_gives_the_parameters_themselves_and_prefix_destination_work():
    model = WithBuffers()
    sd = model.state_dict(keep_vars=True)
    assert sd["lin.weight"] is model.lin.weight and sd["scale"] is model.scale
    dest = OrderedDict(existing=1)
    out = model.lin.state_dict(dest, "enc.")
    assert out is dest and list(out) == ["existing", "enc.weight", "enc.bias"]
    out = model.state_dict(destination=None, prefix="m.", keep_vars=False)
    assert list(out) == ["m.scale", "m.steps", "m.lin.weight", "m.lin.bias"]


def test_keys_and_values_match_torch():
    torch = pytest.importorskip("torch")
    ours = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    theirs.load_state_dict({k: torch.from_numpy(np.array(v.numpy()))
                            for k, v in ours.state_dict().items()})
    ours.load_state_dict(theirs.state_dict())  # torch tensors load too
    for key, value in theirs.state_dict().items():
        np.testing.assert_array_equal(ours.state_dict()[key].numpy(), value.numpy())


def test_load_state_dict_accepts_tensors_arrays_and_its_own_entries():
    model = WithBuffers()
    other = WithBuffers()
    other.lin.weight.array[...] = 4.0
    model.load_state_dict(other.state_dict())
    np.testing.assert_array_equal(model.lin.weight.array, other.lin.weight.array)
    arrays = {k: v.numpy().copy() + 1 for k, v in other.state_dict().items()}
    model.load_state_dict(arrays)
    np.testing.assert_array_equal(model.lin.weight.array, other.lin.weight.array + 1)
    model.load_state_dict(model.state_dict())  # loading its own (aliased) entries is a no-op
    np.testing.assert_array_equal(model.lin.weight.array, other.lin.weight.array + 1)


def test_save_and_module_save_write_values_not_later_changes(tmp_path):
    model = WithBuffers()
    na.save(model.state_dict(), tmp_path / "sd.nf")
    model.save(str(tmp_path / "sd.safetensors"))
    before = model.lin.weight.array.copy()
    model.lin.weight.array += 1
    loaded = na.load(tmp_path / "sd.nf")
    np.testing.assert_array_equal(np.asarray(loaded["lin.weight"]), before)
    fresh = WithBuffers()
    fresh.load(str(tmp_path / "sd.safetensors"))
    np.testing.assert_array_equal(fresh.lin.weight.array, before)


def test_state_dict_copy_is_a_snapshot_in_arrays():
    from neural_arch.nn.module_state import state_dict_copy
    model = WithBuffers()
    snapshot = state_dict_copy(model)
    before = model.lin.weight.array.copy()
    model.lin.weight.array += 1
    assert all(type(v) is np.ndarray for v in snapshot.values())
    np.testing.assert_array_equal(snapshot["lin.weight"], before)
