"""Central finite differences for module parameters (float64), shared by the nn/model tests."""
import numpy as np

from neural_arch.core import no_grad


def weighted_loss(output, weights):
    return (output * weights).sum()


def check_parameter_gradients(module, forward, names=None, eps=1e-6, rtol=1e-5, atol=1e-8,
                              max_entries=12, seed=0):
    """Compare ``.grad`` of the named parameters with central differences of
    ``sum(forward(module) * W)`` for a fixed random ``W``; checks up to ``max_entries``
    entries per parameter (all of them when the parameter is small)."""
    rng = np.random.default_rng(seed)
    params = dict(module.named_parameters())
    names = list(params) if names is None else names
    for p in params.values():
        assert p.dtype == np.float64, "run gradient checks in float64"
    output = forward(module)
    weights = rng.standard_normal(output.shape)
    module.zero_grad()
    weighted_loss(output, weights).backward()
    analytic = {name: params[name].grad.array.copy() for name in names}
    for name in names:
        data = params[name].array.reshape(-1)
        count = data.size
        entries = range(count) if count <= max_entries else \
            rng.choice(count, max_entries, replace=False)
        for j in entries:
            saved = data[j]
            with no_grad():
                data[j] = saved + eps
                plus = weighted_loss(forward(module), weights).item()
                data[j] = saved - eps
                minus = weighted_loss(forward(module), weights).item()
            data[j] = saved
            numeric = (plus - minus) / (2 * eps)
            got = analytic[name].reshape(-1)[j]
            assert abs(got - numeric) <= atol + rtol * abs(numeric), \
                f"{name}[{j}]: analytic {got}, numeric {numeric}"
