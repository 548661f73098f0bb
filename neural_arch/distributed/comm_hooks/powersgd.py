"""PowerSGD (Vogels, Karimireddy and Jaggi, 2019): low-rank gradients, as PyTorch's
``powerSGD_hook``.

For the first ``start_powerSGD_iter`` steps the hook averages exactly (compression early in
training costs accuracy). After that, per bucket:

1. error feedback: the residual this rank kept from the last step is added to the gradients;
2. each gradient is viewed as a matrix M (n rows: its first dimension; m columns: the rest).
   Where a rank-r approximation would not shrink it at least ``min_compression_rate`` times
   ((n + m) r x rate >= n m; every 1-D tensor), it is averaged uncompressed;
3. P = M Q for each matrix; the Ps, together with the uncompressed gradients, are summed in one
   all-reduce; P is orthonormalised (Gram-Schmidt); Q = Mᵀ P, all Qs summed in a second
   all-reduce; the approximation is P Qᵀ / world, the same on every rank. Matrices of one
   shape at equal spacing in the bucket (the same layer of every block) are one strided
   (k, n, m) stack, each of these steps one batched NumPy call for all k;
4. the residual kept is what went in minus what came out (PyTorch's rule: for the
   uncompressed part that is the rank's difference from the average, which sums to zero over
   the ranks, so the next average is unchanged by it).

Q starts from the same random matrix on every rank (drawn from ``random_seed``) and, with
``warm_start``, each step starts from the last step's Q: one power iteration per step then
tracks the top singular vectors over time. Sending P and Q costs (n + m) r values instead of n m.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from .. import collectives
from ..group.process_group import ProcessGroup
from ..reduce_ops import ReduceOp
from ..work import Future
from .bucket import GradBucket
from .default_hooks import CommHookState, allreduce_hook, hook_group


def _positive_int(name: str, value: Any, low: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"PowerSGDState {name} must be an integer >= {low}, got {value!r}")
    return int(value)


class PowerSGDState(CommHookState):
    """PowerSGD's settings and memory (PyTorch's ``PowerSGDState``)."""

    def __init__(self, process_group: Optional[ProcessGroup] = None,
                 matrix_approximation_rank: int = 1, start_powerSGD_iter: int = 10,
                 use_error_feedback: bool = True, warm_start: bool = True,
                 min_compression_rate: float = 2, random_seed: int = 0,
                 orthogonalization_epsilon: float = 0.0) -> None:
        super().__init__(process_group)
        self.matrix_approximation_rank = _positive_int(
            "matrix_approximation_rank", matrix_approximation_rank, 1)
        self.start_powerSGD_iter = _positive_int("start_powerSGD_iter", start_powerSGD_iter, 0)
        if not min_compression_rate > 0:
            raise ValueError(f"PowerSGDState min_compression_rate must be > 0, got "
                             f"{min_compression_rate!r}")
        if not orthogonalization_epsilon >= 0:
            raise ValueError(f"PowerSGDState orthogonalization_epsilon must be >= 0, got "
                             f"{orthogonalization_epsilon!r}")
        self.use_error_feedback = bool(use_error_feedback)
        self.warm_start = bool(warm_start)
        self.min_compression_rate = float(min_compression_rate)
        self.orthogonalization_epsilon = float(orthogonalization_epsilon)
        # Draws the seeds of the initial Qs: the same sequence on every rank.
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: Dict[int, np.ndarray] = {}     # bucket -> residual (error feedback)
        self.q_memory_dict: Dict[int, np.ndarray] = {}  # bucket -> its Qs, back to back
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0

    def compression_stats(self) -> Tuple[float, int, int]:
        """(ratio, elements before, elements after) over every compressed step so far."""
        after = self.total_numel_after_compression
        ratio = self.total_numel_before_compression / after if after else 0.0
        return ratio, self.total_numel_before_compression, after


def _orthogonalize(stack: np.ndarray, epsilon: float) -> None:
    """Gram-Schmidt on the columns of each matrix of a (k, rows, r) stack, in place, all k at
    once. A zero column (a zero gradient) stays zero instead of becoming NaN; ``epsilon`` > 0
    is added to every norm as in PyTorch."""
    for i in range(stack.shape[2]):
        col = stack[:, :, i]
        norm = np.sqrt(np.einsum("kn,kn->k", col, col)) + epsilon
        np.divide(col, norm[:, None], out=col, where=norm[:, None] > 0)
        if i + 1 < stack.shape[2]:
            rest = stack[:, :, i + 1:]
            rest -= col[:, :, None] * np.matmul(col[:, None, :], rest)


class _Stack:
    """k gradients of one shape, viewed as a (k, n, m) stack of matrices in the bucket: they
    sit at equal spacing (the same layer of every block of a model), so one strided view
    holds them all and each step of PowerSGD is one batched call instead of k."""

    def __init__(self, flat: np.ndarray, offsets: List[int], n: int, m: int, r: int) -> None:
        self.k, self.n, self.m, self.r = len(offsets), n, m, r
        step = offsets[1] - offsets[0] if len(offsets) > 1 else n * m
        item = flat.itemsize
        self.matrices = np.lib.stride_tricks.as_strided(
            flat[offsets[0]:], shape=(self.k, n, m), strides=(step * item, m * item, item))


def _stacks(flat: np.ndarray, found: List[Tuple[int, int, int, int]]) -> List[_Stack]:
    """``found``: (offset, n, m, r) of each matrix to compress, in bucket order. Matrices of one
    shape and rank form runs at equal spacing; each run is one stack (order: first seen)."""
    runs: Dict[Tuple[int, int, int], List[List[int]]] = {}
    for offset, n, m, r in found:
        shape_runs = runs.setdefault((n, m, r), [])
        run = shape_runs[-1] if shape_runs else None
        if run is not None and (len(run) == 1 or offset - run[-1] == run[1] - run[0]):
            run.append(offset)
        else:
            shape_runs.append([offset])
    return [_Stack(flat, run, n, m, r) for (n, m, r), shape_runs in runs.items()
            for run in shape_runs]


class _Plan:
    """How a bucket's gradients split into stacks of matrices to compress and tensors sent as
    they are, and where each stack's Ps and Qs sit in the two messages."""

    def __init__(self, state: PowerSGDState, flat: np.ndarray,
                 gradients: List[np.ndarray]) -> None:
        self.plain: List[np.ndarray] = []
        found = []
        base = flat.__array_interface__["data"][0]
        for grad in gradients:  # views of ``flat``: where each starts, in elements
            at = (grad.__array_interface__["data"][0] - base) // flat.itemsize
            matrix = grad.reshape(grad.shape[0] if grad.ndim else 1, -1)
            n, m = matrix.shape
            r = min(n, m, state.matrix_approximation_rank)
            if (n + m) * r * state.min_compression_rate < n * m:
                found.append((at, n, m, r))
                state.total_numel_after_compression += (n + m) * r
            else:
                self.plain.append(grad)
                state.total_numel_after_compression += n * m
            state.total_numel_before_compression += n * m
        self.stacks = _stacks(flat, found)
        self.plain_size = sum(g.size for g in self.plain)
        self.p_size = sum(s.k * s.n * s.r for s in self.stacks)
        self.q_size = sum(s.k * s.m * s.r for s in self.stacks)

    def views(self, memory: np.ndarray, start: int, rows: bool) -> List[np.ndarray]:
        """The (k, n, r) (``rows``) or (k, m, r) stacks laid back to back in ``memory``."""
        out = []
        for s in self.stacks:
            shape = (s.k, s.n if rows else s.m, s.r)
            count = shape[0] * shape[1] * shape[2]
            out.append(memory[start:start + count].reshape(shape))
            start += count
        return out


def powerSGD_hook(state: PowerSGDState, bucket: GradBucket) -> Future:
    """The bucket's gradients replaced by their rank-r PowerSGD approximation, averaged."""
    if state.iter < state.start_powerSGD_iter:
        return allreduce_hook(state, bucket)  # counts the step and the bytes
    pg = hook_group(state)
    world = pg.size
    flat, index = bucket.buffer(), bucket.index()
    if state.use_error_feedback:
        residual = state.error_dict.get(index)
        if residual is not None:
            flat += residual
        sent_in = flat.copy()
    plan = _Plan(state, flat, bucket.gradients())

    q_memory = state.q_memory_dict.get(index) if state.warm_start else None
    if q_memory is None or q_memory.size != plan.q_size:
        q_memory = state.q_memory_dict[index] = np.empty(plan.q_size, dtype=flat.dtype)
        # The same seed on every rank, so every rank starts from the same Qs.
        rng = np.random.default_rng(state.rng.randint(1_000_000_000))
        q_memory[...] = rng.standard_normal(plan.q_size)
    qs = plan.views(q_memory, 0, rows=False)
    for q in qs:
        _orthogonalize(q, state.orthogonalization_epsilon)

    # One message: the uncompressed gradients, then every P.
    first = np.empty(plan.plain_size + plan.p_size, dtype=flat.dtype)
    at = 0
    for grad in plan.plain:
        first[at:at + grad.size] = grad.reshape(-1)
        at += grad.size
    ps = plan.views(first, plan.plain_size, rows=True)
    for stack, p, q in zip(plan.stacks, ps, qs):
        np.matmul(stack.matrices, q, out=p)
    work = collectives.all_reduce(first, ReduceOp.SUM, group=pg, async_op=True)
    state.record(first.nbytes + q_memory.nbytes)
    state.maybe_increase_iter(bucket)

    def finish() -> np.ndarray:
        work.wait()
        at = 0
        for grad in plan.plain:
            np.divide(first[at:at + grad.size].reshape(grad.shape), world, out=grad)
            at += grad.size
        for stack, p, q in zip(plan.stacks, ps, qs):
            _orthogonalize(p, state.orthogonalization_epsilon)  # the same P on every rank
            np.matmul(stack.matrices.transpose(0, 2, 1), p, out=q)
        if plan.q_size:
            collectives.all_reduce(q_memory, ReduceOp.SUM, group=pg)
            np.divide(q_memory, world, out=q_memory)
        for stack, p, q in zip(plan.stacks, ps, qs):
            # Q transposed made contiguous first: NumPy multiplies a strided Qᵀ without BLAS,
            # ~400x slower for a 512 x 512 gradient at rank 2 (the same bits either way)
            np.matmul(p, np.ascontiguousarray(q.transpose(0, 2, 1)), out=stack.matrices)
        if state.use_error_feedback:
            state.error_dict[index] = np.subtract(sent_in, flat)
        if not state.warm_start:
            state.q_memory_dict.pop(index, None)
        return flat
    return Future(finish)
