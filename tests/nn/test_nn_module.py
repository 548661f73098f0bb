"""Module registration, traversal, state dicts, modes, devices and safetensors files."""
import json
import struct

import numpy as np
import pytest

from neural_arch import nn
from neural_arch.core import Tensor
from neural_arch.nn import Linear, Module, Parameter, Sequential

pytestmark = pytest.mark.timeout(60)


class Net(Module):
    def __init__(self):
        super().__init__()
        self.encoder = Linear(3, 4)
        self.scale = Parameter(np.ones(4, dtype=np.float32))
        self.head = Sequential(nn.ReLU(), Linear(4, 2))
        self.register_buffer("steps", np.zeros(1, dtype=np.int64))
        self.register_buffer("scratch", np.zeros(2), persistent=False)
        self.note = "not registered"

    def forward(self, x):
        return self.head(self.encoder(x) * self.scale)


def test_registration_order_and_dotted_names():
    net = Net()
    names = [name for name, _ in net.named_parameters()]
    # A module's own parameters come before its submodules' (PyTorch's order).
    assert names == ["scale", "encoder.weight", "encoder.bias", "head.1.weight", "head.1.bias"]
    assert [n for n, _ in net.named_modules()] == ["", "encoder", "head", "head.0", "head.1"]
    assert [type(c).__name__ for c in net.children()] == ["Linear", "Sequential"]
    assert [n for n, _ in net.named_buffers()] == ["steps", "scratch"]
    assert "note" not in dict(net.named_parameters()) and net.note == "not registered"
    assert isinstance(net.encoder.weight, Tensor) and net.encoder.weight.requires_grad


def test_shared_parameters_are_listed_once():
    a, b = Linear(2, 2), Linear(2, 2)
    b.weight = a.weight
    model = Sequential(a, b)
    params = list(model.parameters())
    assert len(params) == 3
    assert sum(p is a.weight for p in params) == 1
    assert set(model.state_dict()) == {"0.weight", "0.bias", "1.weight", "1.bias"}


def test_a_submodule_that_overrides_named_parameters_is_asked_for_them():
    """A wrapper whose parameters are stand-ins (as a sharding wrapper's shards) shows those
    inside a container too, with dotted names."""
    class Stand(Module):
        def __init__(self):
            super().__init__()
            self.inner = Linear(2, 2)
            self.shard = Tensor(np.zeros(3), requires_grad=True)  # not registered

        def named_parameters(self, prefix="", recurse=True):
            yield (f"{prefix}.flat" if prefix else "flat"), self.shard

    stand = Stand()
    model = Sequential(stand, Linear(2, 1))
    assert [n for n, _ in model.named_parameters()] == ["0.flat", "1.weight", "1.bias"]
    assert list(model.parameters())[0] is stand.shard


def test_reassignment_rules():
    net = Net()
    net.encoder = None
    assert "encoder" not in dict(net.named_children())
    with pytest.raises(TypeError, match="parameter 'scale'"):
        net.scale = Tensor(np.ones(4))
    net.scale = None
    assert "scale" not in dict(net.named_parameters())
    net.steps = np.ones(1, dtype=np.int64)
    assert net.state_dict()["steps"][0] == 1
    del net.head
    with pytest.raises(AttributeError, match="head"):
        net.head

    class Broken(Module):
        def __init__(self):
            self.layer = Linear(1, 1)

    with pytest.raises(AttributeError, match="before Module.__init__"):
        Broken()


def test_state_dict_shares_storage_and_round_trips():
    net = Net()
    state = net.state_dict()
    assert list(state) == ["scale", "steps", "encoder.weight", "encoder.bias", "head.1.weight",
                           "head.1.bias"]
    assert all(isinstance(v, Tensor) for v in state.values())
    state["encoder.weight"][...] = 7.0  # entries share storage with the model, as in torch
    assert np.all(net.encoder.weight.array == 7.0)
    other = Net()
    x = np.random.default_rng(0).standard_normal((5, 3)).astype(np.float32)
    storage = other.encoder.weight.array
    result = other.load_state_dict(net.state_dict())
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert other.encoder.weight.array is storage  # loaded in place
    np.testing.assert_array_equal(other(x).array, net(x).array)


def test_load_state_dict_errors_name_the_key():
    net = Net()
    state = net.state_dict()
    bad = dict(state, **{"encoder.weight": np.zeros((5, 3), dtype=np.float32)})
    with pytest.raises(ValueError, match=r"encoder\.weight.*\(5, 3\).*\(4, 3\)"):
        net.load_state_dict(bad)
    missing = {k: v for k, v in state.items() if k != "head.1.bias"}
    with pytest.raises(KeyError, match=r"head\.1\.bias"):
        net.load_state_dict(missing)
    extra = dict(state, bogus=np.zeros(1))
    with pytest.raises(KeyError, match="bogus"):
        net.load_state_dict(extra)
    result = net.load_state_dict(dict(missing, bogus=np.zeros(1)), strict=False)
    assert result.missing_keys == ["head.1.bias"] and result.unexpected_keys == ["bogus"]


def test_load_keeps_parameter_dtype():
    model = Linear(2, 2, dtype=np.float64)
    model.load_state_dict({"weight": np.ones((2, 2), dtype=np.float32),
                           "bias": np.zeros(2, dtype=np.float32)})
    assert model.weight.dtype == np.float64 and np.all(model.weight.array == 1.0)


def test_train_eval_zero_grad_and_to():
    net = Net()
    assert net.training and net.head[0].training
    assert net.eval() is net and not net.head[1].training
    net.train()
    assert all(m.training for m in net.modules())
    x = np.ones((2, 3), dtype=np.float32)
    net(x).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    grad = net.encoder.weight.grad
    net.zero_grad(set_to_none=False)
    assert net.encoder.weight.grad is grad and not grad.any()
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())
    weight = net.encoder.weight
    assert net.to("cpu") is net and net.encoder.weight is weight and weight.device == "cpu"


def test_call_runs_forward_and_repr():
    net = Net()
    out = net(np.zeros((1, 3), dtype=np.float32))
    assert out.shape == (1, 2)
    text = repr(net)
    assert "(encoder): Linear(in_features=3, out_features=4, bias=True)" in text
    assert "(0): ReLU()" in text


def _safetensors_header(path):
    raw = path.read_bytes()
    (length,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8:8 + length])


def test_safetensors_round_trip(tmp_path):
    net = Net()
    path = tmp_path / "net.safetensors"
    nn.save_state_dict(net, path)
    header = _safetensors_header(path)
    assert header["encoder.weight"]["shape"] == [4, 3]
    assert header["encoder.weight"]["dtype"] == "F32"
    assert header["steps"]["dtype"] == "I64"
    loaded = nn.load_state_dict_file(path)
    expected = net.state_dict()
    assert set(loaded) == set(expected)
    for key in expected:
        np.testing.assert_array_equal(loaded[key], expected[key])
        assert loaded[key].dtype == expected[key].dtype
    fresh = Net()
    fresh.load(path)
    for (name, a), (_, b) in zip(fresh.named_parameters(), net.named_parameters()):
        np.testing.assert_array_equal(a.array, b.array, err_msg=name)
    second = tmp_path / "method.safetensors"
    fresh.save(second)
    assert _safetensors_header(second).keys() == header.keys()
    with pytest.raises(FileNotFoundError, match="missing"):
        nn.load_state_dict_file(tmp_path / "missing.safetensors")


def test_load_file_strict_errors(tmp_path):
    path = tmp_path / "small.safetensors"
    nn.save_state_dict({"weight": np.zeros((3, 3), dtype=np.float32)}, path)
    with pytest.raises(KeyError, match="bias"):
        Linear(3, 3).load(path)
    result = Linear(3, 3).load(path, strict=False)
    assert result.missing_keys == ["bias"]


def test_deepcopy_and_pickle_give_independent_equal_modules():
    import copy
    import pickle

    net = Net()
    x = np.ones((2, 3), dtype=np.float32)
    for clone in (copy.deepcopy(net), pickle.loads(pickle.dumps(net))):
        assert [n for n, _ in clone.named_parameters()] == [n for n, _ in net.named_parameters()]
        np.testing.assert_array_equal(clone(x).array, net(x).array)
        clone.encoder.weight.array[...] = 0
        assert net.encoder.weight.array.any()
        assert isinstance(clone.encoder.weight, Parameter)


def test_register_rejects_clashing_or_dotted_names():
    net = Net()
    with pytest.raises(KeyError, match="'scale' is already registered"):
        net.register_buffer("scale", np.zeros(4))
    with pytest.raises(KeyError, match="'a.b'"):
        net.register_parameter("a.b", None)
    with pytest.raises(TypeError, match="nn.Parameter"):
        net.register_parameter("raw", Tensor(np.ones(2)))
    net.register_parameter("extra", Parameter(np.ones(2)))
    assert "extra" in dict(net.named_parameters())
