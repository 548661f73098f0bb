"""PowerSGD's batched stacks: matrices of one shape at equal spacing in a bucket are compressed
as one strided (k, n, m) stack. Each matrix's result must still be its own rank-r projection
(a stack laid out wrongly would project another matrix's gradient), and the batched
Gram-Schmidt must equal the column-by-column one."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)

# 12 x 12 weights at equal spacing (a stack of three), then one more at another spacing
# (a stack of its own), and weights of other shapes between
SIZES = (8, 12, 12, 12, 12, 5, 12, 12)
RANK = 2


def first_step_worker(rank: int, world_size: int):
    """One compressed sync (no residual yet): the gradients in and the averaged result."""
    from neural_arch.core import manual_seed
    from neural_arch.distributed import DistributedDataParallel
    from neural_arch.distributed import comm_hooks as ch
    from neural_arch.models import MLP
    manual_seed(1)
    module = MLP(list(SIZES))
    for p in module.parameters():  # float64 buckets: the checks below are to 1e-9
        p.array = p.array.astype(np.float64)
    model = DistributedDataParallel(module, auto_sync=False)
    state = ch.PowerSGDState(None, matrix_approximation_rank=RANK, start_powerSGD_iter=0)
    model.register_comm_hook(state, ch.powerSGD_hook)
    rng = np.random.default_rng(7 + rank)
    grads = []
    for p in model.module.parameters():
        p.grad = rng.standard_normal(p.array.shape)
        grads.append(p.grad.array.copy())
    model.sync_gradients()
    return grads, [p.grad.array.copy() for p in model.module.parameters()]


@pytest.mark.parametrize("world_size", [1, 2, 3])  # one rank runs the hook too, as torch's
def test_each_matrix_of_a_stack_is_its_own_projection(world_size):
    results = run_ranks(first_step_worker, world_size, "shm")
    outs = [out for _, out in results]
    for other in outs[1:]:
        assert all(a.tobytes() == b.tobytes() for a, b in zip(outs[0], other))
    mean = [sum(g[i] for g, _ in results) / world_size for i in range(len(outs[0]))]
    checked = 0
    for grad, result in zip(mean, outs[0]):
        if grad.ndim == 1 or (sum(grad.shape) * RANK * 2 >= grad.size):
            np.testing.assert_allclose(result, grad, rtol=1e-12, atol=1e-12)  # sent whole
            continue
        # the result is P Pᵀ (the mean gradient), P orthonormal with RANK columns: projecting
        # the mean gradient on the result's column space gives the result back
        u = np.linalg.svd(result)[0][:, :RANK]
        np.testing.assert_allclose(u @ (u.T @ grad), result, rtol=1e-9, atol=1e-9)
        assert np.linalg.matrix_rank(result, tol=1e-9) == RANK
        checked += 1
    assert checked == 5  # every weight but 12 x 5 and 5 x 12 (not shrunk 2x at rank 2)


def test_stacks_follow_equal_spacing():
    from neural_arch.distributed.comm_hooks.powersgd import _stacks
    flat = np.arange(1000, dtype=np.float32)
    found = [(0, 4, 5, 1), (30, 4, 5, 1), (60, 4, 5, 1), (100, 3, 3, 1), (95, 4, 5, 1),
             (200, 4, 5, 1)]
    stacks = _stacks(flat, found)
    assert [(s.k, s.n, s.m) for s in stacks] == [(3, 4, 5), (2, 4, 5), (1, 3, 3)]
    for s, starts in zip(stacks, ([0, 30, 60], [95, 200], [100])):
        for i, at in enumerate(starts):
            expected = flat[at:at + s.n * s.m].reshape(s.n, s.m)
            assert np.array_equal(s.matrices[i], expected)


def test_batched_gram_schmidt_equals_column_by_column():
    from neural_arch.distributed.comm_hooks.powersgd import _orthogonalize
    rng = np.random.default_rng(0)
    stack = rng.standard_normal((4, 9, 3))
    stack[2, :, 1] = 0.0  # a zero column stays zero, not NaN
    expected = stack.copy()
    for matrix in expected:
        for i in range(matrix.shape[1]):
            norm = np.linalg.norm(matrix[:, i])
            if norm > 0:
                matrix[:, i] /= norm
            matrix[:, i + 1:] -= np.outer(matrix[:, i], matrix[:, i] @ matrix[:, i + 1:])
    _orthogonalize(stack, 0.0)
    np.testing.assert_allclose(stack, expected, rtol=1e-12, atol=1e-12)
    assert not np.isnan(stack).any()
    for k in (0, 1, 3):
        np.testing.assert_allclose(stack[k].T @ stack[k], np.eye(3), atol=1e-12)
