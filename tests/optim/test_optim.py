"""SGD, Adam and AdamW against their update rules written out in NumPy (and PyTorch if present)."""
import numpy as np
import pytest

from neural_arch.core.tensor import Tensor
from neural_arch.optim import SGD, Adam, AdamW

pytestmark = pytest.mark.timeout(60)

STEPS = 6


def Holder(data):
    """A bare parameter: a tensor whose ``.grad`` the tests set by hand (optimizers only
    need ``.array`` and ``.grad``)."""
    return Tensor(np.array(data, copy=True))


def _grads(shape, steps, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape) for _ in range(steps)]


def _reference_sgd(p, grads, lr, momentum=0.0, dampening=0.0, weight_decay=0.0, nesterov=False,
                   maximize=False):
    p = p.copy()
    buf = None
    for g in grads:
        g = -g if maximize else g
        g = g + weight_decay * p
        if momentum:
            buf = g.copy() if buf is None else momentum * buf + (1 - dampening) * g
            g = g + momentum * buf if nesterov else buf
        p = p - lr * g
    return p


def _reference_adam(p, grads, lr, betas, eps, weight_decay, amsgrad=False, decoupled=False):
    p = p.copy()
    m = np.zeros_like(p)
    v = np.zeros_like(p)
    vmax = np.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if decoupled:
            p = p * (1 - lr * weight_decay)
        else:
            g = g + weight_decay * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        m_hat = m / (1 - betas[0] ** t)
        vmax = np.maximum(vmax, v)
        v_used = vmax if amsgrad else v
        # PyTorch's eps placement: eps is added to sqrt(v)/sqrt(bc2), not to sqrt(v_hat) later.
        p = p - lr * m_hat / (np.sqrt(v_used) / np.sqrt(1 - betas[1] ** t) + eps)
    return p


def _run(optimizer_cls, p0, grads, **kwargs):
    param = Holder(p0)
    opt = optimizer_cls([param], **kwargs)
    for g in grads:
        param.grad = g.copy()
        opt.step()
    return param.array


SGD_CONFIGS = [
    dict(lr=0.1),
    dict(lr=0.05, momentum=0.9),
    dict(lr=0.05, momentum=0.9, dampening=0.3),
    dict(lr=0.05, momentum=0.8, nesterov=True),
    dict(lr=0.02, momentum=0.5, weight_decay=0.1),
    dict(lr=0.02, momentum=0.5, maximize=True),
]


@pytest.mark.parametrize("config", SGD_CONFIGS)
def test_sgd_matches_formula(config):
    p0 = np.random.default_rng(1).standard_normal((4, 3))
    grads = _grads((4, 3), STEPS)
    np.testing.assert_allclose(_run(SGD, p0, grads, **config), _reference_sgd(p0, grads, **config),
                               rtol=1e-12, atol=1e-12)


ADAM_CONFIGS = [
    dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0),
    dict(lr=5e-2, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.1),
    dict(lr=1e-2, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, amsgrad=True),
]


@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adam_matches_formula(config):
    p0 = np.random.default_rng(2).standard_normal((5,))
    grads = _grads((5,), STEPS, seed=3)
    expected = _reference_adam(p0, grads, **config)
    np.testing.assert_allclose(_run(Adam, p0, grads, **config), expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("config", ADAM_CONFIGS)
def test_adamw_matches_formula(config):
    config = dict(config, weight_decay=config["weight_decay"] or 0.05)
    p0 = np.random.default_rng(4).standard_normal((2, 3))
    grads = _grads((2, 3), STEPS, seed=5)
    expected = _reference_adam(p0, grads, decoupled=True, **config)
    np.testing.assert_allclose(_run(AdamW, p0, grads, **config), expected, rtol=1e-10, atol=1e-12)


def test_adamw_default_weight_decay_is_pytorchs():
    assert AdamW([Holder(np.zeros(2))]).param_groups[0]["weight_decay"] == 1e-2
    assert Adam([Holder(np.zeros(2))]).param_groups[0]["weight_decay"] == 0.0
    assert SGD([Holder(np.zeros(2))]).param_groups[0]["lr"] == 1e-3


def test_float32_parameters_stay_float32():
    param = Holder(np.ones(3, dtype=np.float32))
    opt = Adam([param], lr=0.1)
    param.grad = np.full(3, 0.5, dtype=np.float32)
    opt.step()
    assert param.array.dtype == np.float32
    assert opt.state[param]["exp_avg"].dtype == np.float32


def test_updates_are_in_place_and_skip_missing_grads():
    with_grad, without_grad = Holder(np.ones(3)), Holder(np.ones(2))
    storage = with_grad.array
    opt = SGD([with_grad, without_grad], lr=0.5, momentum=0.9)
    with_grad.grad = np.array([1.0, 2.0, 3.0])
    opt.step()
    assert with_grad.array is storage
    np.testing.assert_array_equal(storage, [0.5, 0.0, -0.5])
    np.testing.assert_array_equal(without_grad.array, [1.0, 1.0])
    assert without_grad not in opt.state


def test_param_groups_use_their_own_hyper_parameters():
    a, b = Holder(np.ones(2)), Holder(np.ones(2))
    opt = SGD([{"params": [a]}, {"params": [b], "lr": 0.5}], lr=0.1)
    a.grad = np.ones(2)
    b.grad = np.ones(2)
    opt.step()
    np.testing.assert_allclose(a.array, [0.9, 0.9])
    np.testing.assert_allclose(b.array, [0.5, 0.5])
    c = Holder(np.ones(1))
    opt.add_param_group({"params": [c], "momentum": 0.9})
    assert opt.param_groups[2]["lr"] == 0.1 and opt.param_groups[2]["momentum"] == 0.9
    with pytest.raises(ValueError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})


def test_zero_grad_modes():
    param = Holder(np.ones(2))
    opt = SGD([param], lr=0.1)
    param.grad = np.ones(2)
    storage = param.grad
    opt.zero_grad(set_to_none=False)
    assert param.grad is storage and not storage.any()
    opt.zero_grad()
    assert param.grad is None


def test_invalid_arguments():
    with pytest.raises(ValueError, match="Nesterov"):
        SGD([Holder(np.ones(1))], lr=0.1, nesterov=True)
    with pytest.raises(ValueError, match="-0.5"):
        SGD([Holder(np.ones(1))], lr=-0.5)
    with pytest.raises(ValueError, match="beta"):
        Adam([Holder(np.ones(1))], betas=(1.0, 0.9))
    with pytest.raises(ValueError, match="empty"):
        Adam([])
    with pytest.raises(TypeError, match="single"):
        Adam(Holder(np.ones(1)))
    with pytest.raises(TypeError, match="str"):
        SGD(["weight"], lr=0.1)


@pytest.mark.parametrize("cls,kwargs", [(SGD, dict(lr=0.1, momentum=0.9)),
                                        (Adam, dict(lr=0.01, amsgrad=True)),
                                        (AdamW, dict(lr=0.01))])
def test_state_dict_round_trip_continues_identically(cls, kwargs):
    grads = _grads((3,), 8, seed=7)
    p0 = np.arange(3.0)
    first = Holder(p0)
    opt = cls([first], **kwargs)
    for g in grads[:4]:
        first.grad = g.copy()
        opt.step()
    saved = opt.state_dict()
    assert set(saved) == {"state", "param_groups"} and saved["param_groups"][0]["params"] == [0]
    second = Holder(first.array)
    restored = cls([second], lr=123.0)
    restored.load_state_dict(saved)
    assert restored.param_groups[0]["lr"] == kwargs["lr"]
    for g in grads[4:]:
        first.grad, second.grad = g.copy(), g.copy()
        opt.step()
        restored.step()
    np.testing.assert_array_equal(first.array, second.array)


def test_state_dict_is_a_copy_and_load_validates():
    param = Holder(np.ones(2))
    opt = Adam([param], lr=0.1)
    param.grad = np.ones(2)
    opt.step()
    saved = opt.state_dict()
    opt.step()
    assert saved["state"][0]["step"] == 1
    other = Adam([Holder(np.ones(2)), Holder(np.ones(2))])
    with pytest.raises(ValueError, match="1 parameters in the loaded state dict and 2"):
        other.load_state_dict(saved)
    misshapen = Adam([Holder(np.ones(5))])
    with pytest.raises(ValueError, match=r"\(2,\).*\(5,\)"):
        misshapen.load_state_dict(saved)


def test_closure_loss_is_returned():
    param = Holder(np.ones(1))
    opt = SGD([param], lr=0.1)

    def closure():
        param.grad = 2 * param.array
        return float(param.array[0] ** 2)

    assert opt.step(closure) == 1.0
    np.testing.assert_allclose(param.array, [0.8])


@pytest.mark.parametrize("name,kwargs", [
    ("SGD", dict(lr=0.05, momentum=0.9, dampening=0.1, weight_decay=0.01)),
    ("SGD", dict(lr=0.05, momentum=0.9, nesterov=True)),
    ("Adam", dict(lr=0.01, betas=(0.8, 0.95), weight_decay=0.1)),
    ("Adam", dict(lr=0.01, amsgrad=True)),
    ("AdamW", dict(lr=0.01, weight_decay=0.2)),
])
def test_matches_torch(name, kwargs):
    torch = pytest.importorskip("torch")
    ours_cls = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}[name]
    p0 = np.random.default_rng(8).standard_normal((3, 4))
    grads = _grads((3, 4), STEPS, seed=9)
    tp = torch.nn.Parameter(torch.tensor(p0))
    topt = getattr(torch.optim, name)([tp], **kwargs)
    for g in grads:
        tp.grad = torch.tensor(g)
        topt.step()
    np.testing.assert_allclose(_run(ours_cls, p0, grads, **kwargs), tp.detach().numpy(),
                               rtol=1e-10, atol=1e-12)
