"""``Module``'s traversal and lookup API and the ``ModuleDict`` / ``ParameterList`` /
``ParameterDict`` containers, with names and orders checked against torch's for the same
structure."""
import numpy as np
import pytest

import neural_arch as na
from neural_arch import nn
from neural_arch.core import Tensor

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.timeout(60)


def _build(lib):
    """The same structure in ``lib`` (neural_arch or torch): nested containers, a shared layer,
    buffers persistent and not."""
    shared = lib.nn.Linear(2, 2)

    class Net(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = lib.nn.ModuleDict({"b": lib.nn.Linear(2, 3), "a": lib.nn.Sequential(
                lib.nn.Linear(3, 3), lib.nn.ReLU())})
            self.first, self.again = shared, shared
            self.scales = lib.nn.ParameterList([lib.nn.Parameter(lib.ones(2)) for _ in range(2)])
            self.extra = lib.nn.ParameterDict({"z": lib.nn.Parameter(lib.zeros(1)),
                                               "y": lib.nn.Parameter(lib.zeros(3))})
            self.register_buffer("count", lib.zeros(1))
            self.register_buffer("scratch", lib.zeros(1), persistent=False)

    return Net()


def test_names_and_orders_match_torch():
    ours, theirs = _build(na), _build(torch)
    assert [n for n, _ in ours.named_modules()] == [n for n, _ in theirs.named_modules()]
    assert [n for n, _ in ours.named_modules(remove_duplicate=False)] == \
        [n for n, _ in theirs.named_modules(remove_duplicate=False)]
    assert [n for n, _ in ours.named_modules(prefix="m")] == \
        [n for n, _ in theirs.named_modules(prefix="m")]
    assert [n for n, _ in ours.named_children()] == [n for n, _ in theirs.named_children()]
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    assert [n for n, _ in ours.named_parameters(remove_duplicate=False)] == \
        [n for n, _ in theirs.named_parameters(remove_duplicate=False)]
    assert [n for n, _ in ours.named_buffers()] == [n for n, _ in theirs.named_buffers()]
    # a submodule under two names: torch's state_dict lists it under both, ours (left as it
    # is for now) once, so compare the keys without the second name
    assert list(ours.state_dict()) == [k for k in theirs.state_dict()
                                       if not k.startswith("again.")]
    assert len(list(ours.modules())) == len(list(theirs.modules()))
    assert len(list(ours.children())) == len(list(theirs.children()))


def test_get_submodule_parameter_buffer():
    net = _build(na)
    assert net.get_submodule("blocks.a.0") is net.blocks["a"][0]
    assert net.get_submodule("") is net
    assert net.get_parameter("blocks.b.weight") is net.blocks["b"].weight
    assert net.get_parameter("scales.1") is net.scales[1]
    assert net.get_buffer("count") is net.count
    with pytest.raises(AttributeError, match="has no attribute `missing`"):
        net.get_submodule("blocks.missing")
    with pytest.raises(AttributeError, match="`count` is not an nn.Parameter"):
        net.get_parameter("count")


def test_requires_grad_apply_train_eval_zero_grad_return_self():
    net = _build(na)
    assert net.requires_grad_(False) is net
    assert not any(p.requires_grad for p in net.parameters())
    net.requires_grad_()
    assert all(p.requires_grad for p in net.parameters())
    seen = []
    assert net.apply(lambda m: seen.append(type(m).__name__)) is net
    assert seen[-1] == "Net" and seen.count("Linear") == 3
    assert net.eval() is net and not net.blocks["a"][1].training
    assert net.train() is net and net.extra.training
    with pytest.raises(ValueError, match="training mode is expected to be boolean"):
        net.train("no")
    for p in net.parameters():
        p.grad = np.ones_like(p.array)
    assert net.zero_grad(set_to_none=False) is None
    assert all(np.all(p.grad == 0) for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_module_dict_semantics():
    layers = nn.ModuleDict([("x", nn.Linear(1, 1)), ("y", nn.ReLU())])
    assert list(layers) == ["x", "y"] and len(layers) == 2 and "x" in layers
    layers["w"] = nn.Tanh()
    layers.update({"v": nn.Identity()})
    assert list(layers.keys()) == ["x", "y", "w", "v"]
    assert [type(m).__name__ for m in layers.values()] == ["Linear", "ReLU", "Tanh", "Identity"]
    assert isinstance(layers.pop("y"), nn.ReLU) and "y" not in layers
    del layers["w"]
    assert [k for k, _ in layers.items()] == ["x", "v"]
    assert list(layers.state_dict()) == ["x.weight", "x.bias"]
    with pytest.raises(KeyError, match="'nope'"):
        layers["nope"]
    layers.clear()
    assert len(layers) == 0


def test_parameter_list_semantics():
    params = nn.ParameterList([nn.Parameter(np.ones(2)), Tensor(np.zeros(3))])
    assert isinstance(params[1], nn.Parameter) and params[1].requires_grad  # wrapped, as torch
    params.append(nn.Parameter(np.ones(1)))
    params.extend([nn.Parameter(np.ones(4))])
    assert len(params) == 4 and params[-1].shape == (4,)
    assert list(params.state_dict()) == ["0", "1", "2", "3"]
    assert [p.shape for p in params] == [(2,), (3,), (1,), (4,)]
    replacement = nn.Parameter(np.zeros(5))
    params[0] = replacement
    assert params[0] is replacement and next(iter(params.parameters())) is replacement
    with pytest.raises(IndexError, match="index 4 is out of range"):
        params[4]


def test_parameter_dict_semantics():
    params = nn.ParameterDict({"b": nn.Parameter(np.ones(2))})
    params["a"] = Tensor(np.zeros(1))
    params.update([("c", nn.Parameter(np.ones(3)))])
    assert list(params) == ["b", "a", "c"] and list(params.keys()) == ["b", "a", "c"]
    assert isinstance(params["a"], nn.Parameter) and "a" in params and len(params) == 3
    assert list(params.state_dict()) == ["b", "a", "c"]
    assert [v.shape for v in params.values()] == [(2,), (1,), (3,)]
    assert params.pop("b").shape == (2,) and list(params) == ["a", "c"]
    del params["a"]
    assert [k for k, _ in params.items()] == ["c"]
    with pytest.raises(KeyError, match="'a'"):
        params["a"]


def test_repr_matches_torch_for_the_same_layers():
    ours = nn.Sequential(nn.Linear(2, 3), nn.ReLU())
    theirs = torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.ReLU())
    assert repr(ours) == repr(theirs)


def test_zeroing_grads_in_place_counts_a_write_like_the_optimizers():
    """``Module.zero_grad(set_to_none=False)`` is torch's ``grad.zero_()``: the gradient's
    version counts it, as ``Optimizer.zero_grad`` does."""
    from neural_arch.optim import SGD
    net = nn.Linear(2, 1)
    for zero_grad in (net.zero_grad, SGD(net.parameters(), lr=0.1).zero_grad):
        for p in net.parameters():
            p.grad = np.ones_like(p.array)
        versions = [p.grad._version for p in net.parameters()]
        zero_grad(set_to_none=False)
        assert [p.grad._version for p in net.parameters()] == [v + 1 for v in versions]
        assert all(not p.grad.array.any() for p in net.parameters())
