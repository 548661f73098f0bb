"""Workers and NumPy references of the direct shared-memory collective tests, shared by
``test_shm_direct``, ``test_shm_compiled`` and ``test_shm_reference``.

Each worker takes ``(rank, p, store, ...)`` as ``shm_testing.run_ranks`` calls it and returns
what went wrong (an empty list when every result matched its reference).
"""
from __future__ import annotations

import hashlib

import numpy as np

from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.base import Fingerprint

DTYPES = (np.float16, np.float32, np.float64, np.int32, np.int64)
OPS = (ReduceOp.SUM, ReduceOp.PRODUCT, ReduceOp.MIN, ReduceOp.MAX, ReduceOp.AVERAGE)
TINY_WORKSPACE = 4096  # forces many rounds with small vectors


class Calls:
    """Numbers every collective of one rank, as a process group would."""

    def __init__(self) -> None:
        self.seq = 0

    def fp(self, op: str, arr: np.ndarray) -> Fingerprint:
        self.seq += 1
        return Fingerprint(op, self.seq, arr.dtype.name, arr.size)


def rank_input(rank: int, p: int, n: int, dtype, op: ReduceOp) -> np.ndarray:
    """Integer-valued inputs whose reduction is exact in every dtype (float16 included)."""
    i = np.arange(n, dtype=np.int64)
    if op is ReduceOp.SUM:
        values = (rank + 1) * (i % 7 + 1) * np.where(i % 2 == 0, 1, -1)
    elif op is ReduceOp.PRODUCT:
        values = (rank + i) % 3 + 1
    elif op is ReduceOp.AVERAGE:
        # offsets summing to zero over the ranks keep the mean an exact integer
        offset = rank if rank < p - 1 else -sum(range(p - 1))
        values = (i % 5 + 1) * p + offset
    else:
        values = (rank * 7 + i * 3) % 11 - 5
    return values.astype(dtype)


def reference(p: int, n: int, dtype, op: ReduceOp) -> np.ndarray:
    stack = np.stack([rank_input(r, p, n, dtype, op).astype(np.float64) for r in range(p)])
    reduced = {ReduceOp.SUM: stack.sum(0), ReduceOp.PRODUCT: stack.prod(0),
               ReduceOp.MIN: stack.min(0), ReduceOp.MAX: stack.max(0),
               ReduceOp.AVERAGE: stack.sum(0) / p}[op]
    return reduced.astype(dtype)


def all_reduce_cases(p: int, large: bool):
    sizes = sorted({0, 1, max(p - 1, 0), 13, 1031, 4099, 40_009})
    for n in sizes:
        for dtype in DTYPES:
            for op in OPS:
                if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                    continue
                yield n, dtype, op
    if large:
        for dtype, op in ((np.float32, ReduceOp.SUM), (np.float64, ReduceOp.AVERAGE),
                          (np.int64, ReduceOp.MAX), (np.float16, ReduceOp.MIN),
                          (np.int32, ReduceOp.PRODUCT)):
            yield 1_048_583, dtype, op


def check_all_reduce_matrix(rank, p, store, workspace_bytes, large):
    t = shm.create(rank, p, store, 60.0, workspace_bytes=workspace_bytes)
    calls, failures = Calls(), []
    try:
        for n, dtype, op in all_reduce_cases(p, large):
            buf = rank_input(rank, p, n, dtype, op)
            t.collectives.all_reduce(buf, op, calls.fp("all_reduce", buf))
            if not np.array_equal(buf, reference(p, n, dtype, op)):
                failures.append((n, np.dtype(dtype).name, op.name))
        return failures
    finally:
        t.close()


def rank_order_reduction(inputs: list, op: ReduceOp) -> np.ndarray:
    """The direct all-reduce's documented result: ranks 0..p-1 in order; a float16 SUM or
    AVERAGE summed in float32 (and divided there) and rounded once."""
    if inputs[0].dtype == np.float16 and op is not ReduceOp.PRODUCT:
        wide = rank_order_reduction([x.astype(np.float32) for x in inputs], op)
        return wide.astype(np.float16)
    expected = inputs[0].copy()
    for other in inputs[1:]:
        np.multiply(expected, other, out=expected) if op is ReduceOp.PRODUCT \
            else np.add(expected, other, out=expected)
    if op is ReduceOp.AVERAGE:
        expected = expected / np.asarray(len(inputs), expected.dtype)
    return expected


def random_floats_identical(rank, p, store, workspace_bytes):
    """Random floats: each rank checks against the rank-order reduction; returns digests."""
    t = shm.create(rank, p, store, 60.0, workspace_bytes=workspace_bytes)
    calls, digests, failures = Calls(), [], []
    try:
        for n in (3, 1000, 300_007):
            for dtype in (np.float16, np.float32, np.float64):
                for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.PRODUCT):
                    rngs = [np.random.default_rng([r, n, np.dtype(dtype).num]) for r in range(p)]
                    inputs = [g.uniform(0.5, 1.5, n).astype(dtype) for g in rngs]
                    expected = rank_order_reduction(inputs, op)
                    buf = inputs[rank].copy()
                    t.collectives.all_reduce(buf, op, calls.fp("all_reduce", buf))
                    if not np.array_equal(buf.view(np.uint8), expected.view(np.uint8)):
                        failures.append((n, np.dtype(dtype).name, op.name))
                    digests.append(hashlib.sha256(buf.tobytes()).hexdigest())
        return failures, digests
    finally:
        t.close()


def nan_payloads(rank, p, store):
    """Every rank holds NaNs with its own payload at the same places: the results must still
    be the same bits everywhere (two ranks both reduce, so the operand order must agree)."""
    t = shm.create(rank, p, store, 60.0, workspace_bytes=TINY_WORKSPACE)
    try:
        digests = []
        for n in (5, 1 << 20):  # one prepared round, and many rounds
            buf = np.linspace(-1, 1, n).astype(np.float32)
            bits = buf.view(np.uint32)
            bits[::3] = 0x7FC00000 + rank + 1  # quiet NaNs, a payload per rank
            t.collectives.all_reduce(buf, ReduceOp.SUM, Fingerprint("all_reduce", n, "float32",
                                                                    n))
            assert np.isnan(buf[::3]).all()
            digests.append(hashlib.sha256(buf.tobytes()).hexdigest())
        return digests
    finally:
        t.close()


def other_collectives(rank, p, store, workspace_bytes):
    t = shm.create(rank, p, store, 60.0, workspace_bytes=workspace_bytes)
    calls, failures = Calls(), []
    sizes = (0, 1, max(p - 1, 0), 13, 1031, 70_001)
    if workspace_bytes == shm.DEFAULT_WORKSPACE_BYTES:
        sizes += (300_007,)  # several 1 MiB broadcast rounds
    try:
        for n in sizes:
            for dtype in (np.float32, np.int64, np.float16):
                # broadcast from every root
                for root in range(p):
                    data = (np.arange(n) * (root + 3) % 1000).astype(dtype)
                    buf = data.copy() if rank == root else np.full(n, -1, dtype)
                    t.collectives.broadcast(buf, root, calls.fp("broadcast", buf))
                    if not np.array_equal(buf, data):
                        failures.append(("broadcast", n, root))
                # all-gather in rank order
                mine = (np.arange(n) % 97 + 100 * rank).astype(dtype)
                out = np.full(p * n, -1, dtype)
                t.collectives.all_gather(mine, out, calls.fp("all_gather", mine))
                gathered = np.concatenate([(np.arange(n) % 97 + 100 * r).astype(dtype)
                                           for r in range(p)])
                if not np.array_equal(out, gathered):
                    failures.append(("all_gather", n))
                # in place: this rank's block of the output is the input
                out = np.full(p * n, -1, dtype)
                out[rank * n:(rank + 1) * n] = mine
                t.collectives.all_gather(out[rank * n:(rank + 1) * n], out,
                                      calls.fp("all_gather", mine))
                if not np.array_equal(out, gathered):
                    failures.append(("all_gather in place", n))
                # reduce-scatter, out of place and in place
                for op in (ReduceOp.SUM, ReduceOp.MAX):
                    send = rank_input(rank, p, p * n, dtype, op)
                    full = reference(p, p * n, dtype, op)
                    recv = np.full(n, -1, dtype)
                    t.collectives.reduce_scatter(send, recv, op, calls.fp("reduce_scatter", send))
                    if not np.array_equal(recv, full[rank * n:(rank + 1) * n]):
                        failures.append(("reduce_scatter", n, op.name))
                    inplace = send.copy()
                    view = inplace[rank * n:(rank + 1) * n]
                    t.collectives.reduce_scatter(inplace, view, op,
                                              calls.fp("reduce_scatter", inplace))
                    if not np.array_equal(view, full[rank * n:(rank + 1) * n]):
                        failures.append(("reduce_scatter in place", n, op.name))
            avg_send = rank_input(rank, p, p * n, np.float64, ReduceOp.AVERAGE)
            avg_recv = np.empty(n)
            t.collectives.reduce_scatter(avg_send, avg_recv, ReduceOp.AVERAGE,
                                      calls.fp("reduce_scatter", avg_send))
            avg_full = reference(p, p * n, np.float64, ReduceOp.AVERAGE)
            if not np.array_equal(avg_recv, avg_full[rank * n:(rank + 1) * n]):
                failures.append(("reduce_scatter average", n))
        return failures
    finally:
        t.close()


def mismatched(rank, p, store, kind):
    t = shm.create(rank, p, store, 30.0)
    try:
        buf = np.ones(4 if rank == 0 or kind != "count" else 5, np.float32)
        if kind == "op" and rank == 1:
            t.collectives.broadcast(buf, 0, Fingerprint("broadcast", 1, "float32", 4))
        else:
            seq = 2 if kind == "seq" and rank == p - 1 else 1
            t.collectives.all_reduce(buf, ReduceOp.SUM,
                                  Fingerprint("all_reduce", seq, "float32", buf.size))
        return "no error"
    finally:
        t.close()
