"""What the mpi transport's compiled exchanges (``mpi_compiled``, ``mpi_kernels``) are set up
with: the words of a kernel's state (``kernel_state``: the peer, the tag, MPI's handles, how long
a kernel polls, where a header's seq lies, the requests it posts into), and the self-check that
runs every kernel once with this process itself before any is used (``check``), so that a
kernel that cannot run here, or gives another result, is refused at load and the exchanges stay
in mpi4py.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from .base import HEADER_SIZE, SEQ_OFFSET
from .mpi_waiting import SPIN_S, YIELD_AFTER_S
from .mpi_wire import PACKED_MAX_BYTES, TAG

# How long a kernel polls before the transport's wait takes over (which then polls as long
# again before it naps), and after how long each of its polls yields the core first: the
# wait's own stretches (``mpi_waiting``); in 2 ms a two-rank ring step of 16 MiB completes on
# two cores, and the wait's liveness looks come every half second
SPIN_NS, YIELD_NS = int(SPIN_S * 1e9), int(YIELD_AFTER_S * 1e9)
# The vectors whose sums the kernel folds itself (a 1-D array of another dtype, or another
# reduction, is folded by ``use`` in Python after the kernel's swap); int64 for the words of
# the collectives that run as one all-reduce (``algorithms.summed``)
SUM_DTYPES = (np.dtype(np.float32), np.dtype(np.float64), np.dtype(np.int64))


def kernel_state(k: Any, MPI: Any, peer: int, comm: int, requests: list) -> np.ndarray:
    """The kernels' state for calls with ``peer`` on the communicator with handle ``comm``,
    posting into the handles of ``requests`` (four ``MPI.Request``, kept alive beside it)."""
    state = np.zeros(k.STATE_WORDS, np.int64)
    state[[k.PEER, k.TAG, k.COMM, k.BYTE, k.SPIN_NS, k.YIELD_NS, k.PACKED_MAX, k.SEQ_AT]] = (
        peer, TAG, comm, MPI._handleof(MPI.BYTE), SPIN_NS, YIELD_NS, PACKED_MAX_BYTES,
        SEQ_OFFSET)
    state[k.REQS:k.REQS + 4] = [MPI._addressof(request) for request in requests]
    return state


def check(k: Any, MPI: Any) -> None:
    """Compile (or load from Numba's cache) the kernels and run them with this process itself
    on a private communicator: a swap, a round of recursive doubling, a sendrecv (packed and
    not) and the ring's two steps must come back whole and DONE (a sum folded in each order,
    and a mean; the round's seq in its header); another header, MISMATCH."""
    comm = MPI.COMM_SELF.Dup()
    try:
        packed, first = np.zeros(HEADER_SIZE + 64, np.uint8), np.zeros(HEADER_SIZE + 64, np.uint8)
        requests = [MPI.Request() for _ in range(4)]
        state = kernel_state(k, MPI, 0, MPI._handleof(comm), requests)
        payload, header = np.arange(5, dtype=np.uint8), bytes(range(HEADER_SIZE))
        code = k.swap(payload, header, packed, first, state)
        sent = header + payload.tobytes()
        if (code, first[:len(sent)].tobytes()) != (k.DONE, sent):
            raise RuntimeError(f"a swap with itself gave {code} and {first[:len(sent)]}")
        if k.poll(header[::-1], first, 5, state, 0) != k.MISMATCH:
            raise RuntimeError("a swap with itself did not see another header")
        for dtype in SUM_DTYPES:  # a float's halves not whole (a truncating fold fails)
            start = [1.5, -2.0, 3.0] if dtype.kind == "f" else [3, -2, 5]
            twice = [2 * v for v in start]
            buf = np.array(start, dtype)
            for mean, expected in ((0, twice), (2, start)):
                code = k.swap_sum(buf, header, packed, first, state, 1, True, False, mean)
                if (code, buf.tolist()) != (k.DONE, expected):
                    raise RuntimeError(f"a {dtype.name} sum with itself (mean {mean}) gave "
                                       f"{code} and {buf.tolist()}")
                buf[:] = start
            made = np.frombuffer(header, np.uint8).copy()  # a round's header, its seq written
            code = k.round_sum(buf, made, 7, packed, first, state, True, 0)
            if (code, buf.tolist(), made[SEQ_OFFSET:SEQ_OFFSET + 8].tobytes()) != (
                    k.DONE, twice, (7).to_bytes(8, "little")):
                raise RuntimeError(f"a {dtype.name} round with itself gave {code}, "
                                   f"{buf.tolist()} and header {made.tobytes()!r}")
        for packed_max in (0, 64):  # the payload after the header, then behind it
            state[k.PACKED_MAX] = packed_max
            got = np.zeros(5, np.uint8)
            code = k.sendrecv(payload, header, packed, 0, got, header, first, 0, state)
            if (code, got.tolist()) != (k.DONE, payload.tolist()):
                raise RuntimeError(f"a sendrecv with itself gave {code} and {got.tolist()}")
        code = k.sendrecv(payload, header, packed, 0, got, header[::-1], first, 0, state)
        if code != k.MISMATCH:
            raise RuntimeError(f"a sendrecv with itself gave {code} for another header")
        k.poll_sendrecv(header, first, got, 0, state, 1 << 30)  # its send, completed
        for dtype in SUM_DTYPES:  # the ring's two steps with itself: both halves a + b
            start = [1.5, -2.0] if dtype.kind == "f" else [7, -3]
            buf = np.array(start, dtype)
            whole = start[0] + start[1]
            for mean, expected in ((0, [whole] * 2), (2, [whole / 2] * 2)):
                code = k.ring_steps(buf[:1], buf[1:], np.zeros(1, dtype), header, header,
                                    packed, first, 0, state, mean)
                if (code, buf.tolist()) != (k.DONE, expected):
                    raise RuntimeError(f"the ring's steps with itself ({dtype.name}, mean "
                                       f"{mean}) gave {code} and {buf.tolist()}")
                buf[:] = start
    finally:
        comm.Free()
