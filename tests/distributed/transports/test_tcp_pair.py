"""The tcp transport's two-rank collectives (``transports.tcp_pair``): chosen by default, the
portable algorithms' bits and bytes, one transport loop per collective; and the socket buffers
of a peer on the same host."""
from __future__ import annotations

import socket

import numpy as np
import pytest

from dist_harness import run_ranks
from neural_arch import distributed as dist

pytestmark = pytest.mark.timeout(60)

OPS = [dist.ReduceOp.SUM, dist.ReduceOp.AVERAGE, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN,
       dist.ReduceOp.MAX]
SUMS = OPS[:2]
# (elements, dtypes, ops): below 64 KiB recursive doubling's bits, above the ring's; 600_001
# float32 elements make chunks of more than one 1 MiB piece
CASES = [(1, (np.float32, np.int32), OPS), (13, (np.float16, np.float64, np.int64), OPS),
         (16_385, (np.float32, np.float16), OPS), (600_001, (np.float32, np.float16), SUMS)]


def _values(rank: int, size: int, dtype) -> np.ndarray:
    """Random values with the cases that tell operand orders apart: signed zeros (MIN, MAX),
    NaNs whose payloads name the rank, infinities, and sums past float16's range."""
    rng = np.random.default_rng([rank, size])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size).astype(dtype)
    x = (rng.standard_normal(size) * 100).astype(dtype)
    head = np.array([0.0, -0.0, np.inf, 60000.0, -0.0, 1.0], dtype)[:size]
    x[:head.size] = head if rank == 0 else -head[::-1]
    if size > 8:
        bits = x.view({2: np.uint16, 4: np.uint32, 8: np.uint64}[x.itemsize])
        bits[7] = bits.dtype.type(~0 >> 1 & np.iinfo(bits.dtype).max) - rank  # a NaN per rank
    return x


def _pair_job(rank: int, world: int) -> dict:
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.transports.sent_bytes import counting_sent_bytes
    t = resolve_group(None).transport
    report = {"chosen": algorithms.select("all_reduce", t, 1 << 20), "differ": [],
              "buffers": [s.getsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF)
                          for s in t._socks.values()]}
    np.seterr(over="ignore", invalid="ignore")  # products past the range, inf - inf
    for size, dtypes, ops in CASES:
        for dtype in dtypes:
            x = _values(rank, size, dtype)
            portable = "ring" if x.nbytes >= 64 * 1024 else "recursive_doubling"
            for op in ops:
                if op is dist.ReduceOp.AVERAGE and x.dtype.kind != "f":
                    continue
                ours, theirs = x.copy(), x.copy()
                with counting_sent_bytes() as ours_sent:
                    dist.all_reduce(ours, op)
                with counting_sent_bytes() as theirs_sent:
                    dist.all_reduce(theirs, op, algorithm=portable)
                if (ours.tobytes() != theirs.tobytes()
                        or ours_sent.counted != theirs_sent.counted):
                    report["differ"].append(f"all_reduce {size} x {x.dtype} {op.name}")
    big = _values(rank, 600_001, np.float32)
    loops = []
    run = t._run
    t._run = lambda *args: loops.append(1) or run(*args)
    try:
        dist.all_reduce(big.copy(), dist.ReduceOp.AVERAGE)
    finally:
        del t._run
    report["loops"] = len(loops)
    for size in (0, 5, 300_001):
        x = _values(rank, 2 * size, np.float32)
        got = [np.empty(size, np.float32) for _ in range(2)]
        dist.reduce_scatter_tensor(got[0], x, dist.ReduceOp.AVERAGE)
        dist.reduce_scatter_tensor(got[1], x, dist.ReduceOp.AVERAGE, algorithm="ring")
        gathered = [np.empty(4 * size, np.float32) for _ in range(2)]
        dist.all_gather_into_tensor(gathered[0], x)
        dist.all_gather_into_tensor(gathered[1], x, algorithm="ring")
        sent = [x.copy() for _ in range(2)]
        for src in (0, 1):
            dist.broadcast(sent[0], src=src)
            dist.broadcast(sent[1], src=src, algorithm="tree")
        for name, (a, b) in (("reduce_scatter", got), ("all_gather", gathered),
                             ("broadcast", sent)):
            if a.tobytes() != b.tobytes():
                report["differ"].append(f"{name} {size}")
    dist.barrier()
    return report


@pytest.fixture(scope="module")
def reports():
    # NumPy's forms of the float16 loops: their compiled forms have the same bits
    # (test_reduction_kernels), and importing Numba would take most of the test's time
    return run_ranks(_pair_job, 2, "tcp", timeout=50, env={"NEURAL_ARCH_NUMBA": "0"},
                     init_kwargs={"timeout": 30})


def test_two_ranks_run_the_pipelined_collectives_by_default(reports):
    assert [r["chosen"] for r in reports] == ["native", "native"]
    # the whole all-reduce (two chunks of two pieces each way) in one transport loop
    assert [r["loops"] for r in reports] == [1, 1]


def test_pipelined_collectives_keep_the_portable_bits_and_bytes(reports):
    assert [r["differ"] for r in reports] == [[], []]


def test_a_peer_on_this_host_gets_small_socket_buffers(reports):
    for r in reports:  # (Linux reports twice the size asked for: its bookkeeping share)
        assert all(size <= 256 * 1024 for size in r["buffers"]), r["buffers"]
