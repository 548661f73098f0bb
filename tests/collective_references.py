"""What the multi-process collective tests compare against: the inputs every rank makes, the
closed-form results over them, and float reductions folded in the order each algorithm
documents (ring, recursive doubling, shm_direct), so results can be checked bit for bit."""
from __future__ import annotations

import hashlib

import numpy as np

from neural_arch import distributed as dist

WORLD_SIZES = [1, 2, 3, 4]
DTYPES = [np.float16, np.float32, np.float64, np.int32, np.int64]
OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX,
       dist.ReduceOp.AVERAGE]
LARGE = 1_000_003  # prime, above a million
FORCED = {"shm": ["ring", "recursive_doubling", "shm_direct"],
          "tcp": ["ring", "recursive_doubling"],
          "mpi": ["ring", "recursive_doubling", "native"]}
# the algorithms of broadcast / all-gather / reduce-scatter / barrier, by backend
FORCED_OTHERS = {"shm": [None, "portable", "shm_direct"], "tcp": [None, "portable"],
                 "mpi": [None, "portable", "native"]}
PORTABLE = {"broadcast": "tree", "all_gather": "ring", "reduce_scatter": "ring",
            "barrier": "dissemination"}
INIT = {"timeout": 60}


def forced(collective: str, choice):
    """The algorithm name a suite passes for ``choice`` ("portable": the transport-agnostic one)."""
    return PORTABLE[collective] if choice == "portable" else choice


def inputs_of(rank: int, size: int, dtype, op, salt: int = 0) -> np.ndarray:
    rng = np.random.default_rng([rank, size, OPS.index(op), salt])
    if op is dist.ReduceOp.PRODUCT:
        values = rng.choice([-2, -1, 1, 2], size=size)
    else:
        values = rng.integers(-50, 50, size=size)
    return values.astype(dtype)


def expected_over(ranks, size: int, dtype, op, salt: int = 0) -> np.ndarray:
    """The reduction of ``inputs_of`` over ``ranks`` (global ranks: a group's members)."""
    stacked = np.stack([inputs_of(r, size, dtype, op, salt) for r in ranks]).astype(np.float64)
    kind = {dist.ReduceOp.PRODUCT: np.prod, dist.ReduceOp.MIN: np.min,
            dist.ReduceOp.MAX: np.max}.get(op, np.sum)
    result = kind(stacked, axis=0).astype(dtype)
    if op is dist.ReduceOp.AVERAGE:
        result = np.divide(result, np.dtype(dtype).type(len(ranks)))
    return result


def expected_reduction(ws: int, size: int, dtype, op, salt: int = 0) -> np.ndarray:
    return expected_over(range(ws), size, dtype, op, salt)


def ops_for(dtype):
    return [op for op in OPS if op is not dist.ReduceOp.AVERAGE or np.dtype(dtype).kind == "f"]


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()


def random_of(rank: int, size: int, dtype, salt: int = 0) -> np.ndarray:
    """Random floats that any rank can regenerate for any other rank."""
    return np.random.default_rng([rank, size, salt, 7]).standard_normal(size).astype(dtype)


UFUNCS = {dist.ReduceOp.SUM: np.add, dist.ReduceOp.AVERAGE: np.add,
          dist.ReduceOp.PRODUCT: np.multiply, dist.ReduceOp.MIN: np.minimum,
          dist.ReduceOp.MAX: np.maximum}
FLOAT_OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVERAGE, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
             dist.ReduceOp.MAX]
# tolerances against a float64 reference, for algorithms with no documented reduction order
TOLERANCE = {np.float16: (1e-2, 5e-2), np.float32: (1e-5, 1e-5), np.float64: (1e-12, 1e-12)}


def fold(parts: list, order, ufunc) -> np.ndarray:
    """``((parts[o0] op parts[o1]) op parts[o2]) ...``: one left fold in the given order."""
    order = list(order)
    acc = parts[order[0]].copy()
    for r in order[1:]:
        ufunc(acc, parts[r], out=acc)
    return acc


def recursive_doubling_order(parts: list, ufunc) -> np.ndarray:
    """recursive_doubling.py: the first ``2 * extra`` ranks pair up (even into odd), then
    vranks combine with ``vrank ^ mask``, the lower vrank's operand first."""
    n = len(parts)
    pow2 = 1 << (n.bit_length() - 1)
    extra = n - pow2
    vals = [ufunc(parts[2 * v], parts[2 * v + 1]) if v < extra else parts[v + extra].copy()
            for v in range(pow2)]
    mask = 1
    while mask < pow2:
        vals = [ufunc(vals[min(v, v ^ mask)], vals[max(v, v ^ mask)]) for v in range(pow2)]
        mask <<= 1
    return vals[0]


def in_documented_order(parts: list, op, algorithm: str, bounds) -> "np.ndarray | None":
    """The exact bits of a reduction of ``parts`` (one per rank) in the order the algorithm's
    docstring fixes; None when it documents none (MPI's native collectives).

    shm_direct: every element over ranks 0..p-1 (float16 sums in float32, rounded once after
    the mean). ring: chunk ``c`` (``bounds[c]``) starts at rank c + 1 and is folded in ring
    order, ending at rank c. AVERAGE: that sum / p.
    """
    n, ufunc = len(parts), UFUNCS[op]
    if n == 1:
        out = parts[0].copy()
    elif algorithm == "shm_direct" and parts[0].dtype == np.float16 and ufunc is np.add:
        # float16 sums in float32, the mean taken there, rounded once (reductions.kernels)
        wide = fold([p.astype(np.float32) for p in parts], range(n), ufunc)
        if op is dist.ReduceOp.AVERAGE:
            wide /= np.float32(n)
        return wide.astype(np.float16)
    elif algorithm == "shm_direct":
        out = fold(parts, range(n), ufunc)
    elif algorithm == "ring":
        out = np.empty_like(parts[0])
        for c, (lo, hi) in enumerate(bounds):
            out[lo:hi] = fold([p[lo:hi] for p in parts], [(c + 1 + i) % n for i in range(n)],
                              ufunc)
    elif algorithm == "recursive_doubling":
        out = recursive_doubling_order(parts, ufunc)
    else:
        return None
    if op is dist.ReduceOp.AVERAGE and n > 1:
        np.divide(out, out.dtype.type(n), out=out)
    return out


def check_float_reduction(got: np.ndarray, parts: list, op, algorithm: str, bounds,
                          what: str) -> None:
    """Exact bits where the order is documented; otherwise close to a float64 reference
    (MIN and MAX are exact whatever the order)."""
    want = in_documented_order(parts, op, algorithm, bounds)
    if want is not None or op in (dist.ReduceOp.MIN, dist.ReduceOp.MAX):
        if want is None:
            want = fold(parts, range(len(parts)), UFUNCS[op])
        np.testing.assert_array_equal(got, want, err_msg=what)
        return
    ref = fold([p.astype(np.float64) for p in parts], range(len(parts)), UFUNCS[op])
    if op is dist.ReduceOp.AVERAGE:
        ref /= len(parts)
    rtol, atol = TOLERANCE[got.dtype.type]
    np.testing.assert_allclose(got.astype(np.float64), ref, rtol=rtol, atol=atol, err_msg=what)


# ----- suites, run on every rank -----------------------------------------------------------
# at a million elements: inputs -2..2 keep float16 products exact; the rest are small integers
