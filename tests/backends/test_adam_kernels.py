"""Adam's compiled CPU update (``backends.adam_kernels``): bit for bit the NumPy form's result,
close to a float64 reference, and the NumPy form wherever the kernel does not apply."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.backends import adam_kernels
from neural_arch.nn.parameter import Parameter
from neural_arch.optim import Adam, AdamW

needs_kernel = pytest.mark.skipif(not adam_kernels.available(),
                                  reason="Numba is not installed or is switched off")
SETTINGS = [(AdamW, {"weight_decay": 0.1}), (AdamW, {"weight_decay": 0.0}),
            (Adam, {"weight_decay": 0.05}), (Adam, {})]


def numpy_form(optimizer):
    """``optimizer`` made to skip the kernel and run the NumPy form."""
    optimizer._compiled_update = lambda *args, **kwargs: False
    return optimizer


def run(cls, kwargs, start, grads, compiled=True, lr=1e-2):
    param = Parameter(start.copy())
    optimizer = cls([param], lr=lr, **kwargs)
    if not compiled:
        numpy_form(optimizer)
    for grad in grads:
        param.grad = grad.copy()
        optimizer.step()
    return param.array, optimizer.state[param]


def series(shape, dtype, steps=6, seed=0):
    rng = np.random.default_rng(seed)
    start = rng.standard_normal(shape).astype(dtype)
    return start, [rng.standard_normal(shape).astype(dtype) for _ in range(steps)]


@needs_kernel
@pytest.mark.parametrize("cls,kwargs", SETTINGS)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1,), (7,), (33, 5), (4, 3, 129)])
def test_kernel_equals_the_numpy_form_bit_for_bit(cls, kwargs, dtype, shape):
    start, grads = series(shape, dtype)
    ours, state = run(cls, kwargs, start, grads)
    theirs, their_state = run(cls, kwargs, start, grads, compiled=False)
    assert ours.dtype == dtype
    np.testing.assert_array_equal(ours, theirs)
    for key in ("exp_avg", "exp_avg_sq"):
        np.testing.assert_array_equal(state[key], their_state[key])
    assert not np.array_equal(ours, start)  # it did step


def reference(cls, kwargs, start, grads, lr=1e-2, betas=(0.9, 0.999), eps=1e-8):
    """torch's Adam/AdamW written out in float64."""
    p, m, v = start.astype(np.float64), 0.0, 0.0
    wd = kwargs.get("weight_decay", 0.01 if cls is AdamW else 0.0)
    for step, g in enumerate(grads, 1):
        g = g.astype(np.float64)
        if cls is AdamW:
            p = p * (1 - lr * wd)
        else:
            g = g + wd * p
        m = betas[0] * m + (1 - betas[0]) * g
        v = betas[1] * v + (1 - betas[1]) * g * g
        denom = np.sqrt(v) / np.sqrt(1 - betas[1] ** step) + eps
        p = p - lr / (1 - betas[0] ** step) * m / denom
    return p


@needs_kernel
@pytest.mark.parametrize("cls,kwargs", SETTINGS)
def test_kernel_is_close_to_a_float64_reference(cls, kwargs):
    start, grads = series((64, 9), np.float32, steps=8, seed=3)
    ours, _ = run(cls, kwargs, start, grads)
    np.testing.assert_allclose(ours, reference(cls, kwargs, start, grads), rtol=2e-6, atol=2e-6)


@needs_kernel
def test_non_finite_gradients_give_what_the_numpy_form_gives():
    start, grads = series((16,), np.float32, steps=2)
    grads[1][[1, 5]] = [np.inf, np.nan]
    grads[1][7] = 0.0
    for cls, kwargs in SETTINGS:
        ours, _ = run(cls, kwargs, start, grads)
        with np.errstate(invalid="ignore"):  # the NumPy form warns of the NaN it makes
            theirs, _ = run(cls, kwargs, start, grads, compiled=False)
        np.testing.assert_array_equal(ours, theirs)  # NaN where NaN, equal elsewhere


@pytest.mark.parametrize("case", ["float16", "mixed", "strided", "empty", "list"])
def test_update_declines_what_it_does_not_cover(case):
    shape = (0,) if case == "empty" else (6, 4)
    dtype = np.float16 if case == "float16" else np.float32
    arrays = [np.ones(shape, dtype) for _ in range(4)]
    if case == "mixed":
        arrays[1] = arrays[1].astype(np.float64)
    if case == "strided":
        arrays[0] = np.ones((6, 8), dtype)[:, ::2]
    if case == "list":
        arrays[2] = [1.0] * 24
    before = [np.array(a, copy=True) for a in arrays]
    assert adam_kernels.update(*arrays, decay=0.9, l2=0.0, beta1=0.9, beta2=0.999,
                               bias_correction2_sqrt=0.1, eps=1e-8, step_size=0.1) is False
    for a, b in zip(arrays, before):
        np.testing.assert_array_equal(np.asarray(a), b)  # untouched


def test_declined_parameters_still_step_by_the_numpy_form():
    """A strided parameter (a view) is updated by the NumPy form, as torch would update it."""
    base = np.random.default_rng(5).standard_normal((6, 8)).astype(np.float32)
    start = base[:, ::2].copy()
    param = Parameter(base[:, ::2])
    assert not param.array.flags.c_contiguous
    grads = [np.full((6, 4), 0.5, np.float32)] * 3
    optimizer = AdamW([param], lr=1e-2)
    for g in grads:
        param.grad = g.copy()
        optimizer.step()
    want = reference(AdamW, {}, start, grads)
    np.testing.assert_allclose(param.array, want, rtol=2e-6, atol=2e-6)


def test_switched_off_kernel_is_reported_unavailable():
    import os
    import subprocess
    import sys
    env = dict(os.environ, NEURAL_ARCH_NUMBA="0")
    code = ("from neural_arch.backends import adam_kernels as k; import numpy as np; "
            "a = [np.ones(3, np.float32) for _ in range(4)]; "
            "print(k.available(), k.update(*a, decay=1.0, l2=0.0, beta1=0.9, beta2=0.9, "
            "bias_correction2_sqrt=1.0, eps=1e-8, step_size=0.1))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "False"]
