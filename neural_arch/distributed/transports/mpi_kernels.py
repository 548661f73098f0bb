"""The mpi transport's two-rank swap (``mpi_swap``) as one compiled call into the MPI library.

``swap`` takes the steps ``mpi_swap.swap`` takes through mpi4py, on the same messages: the
header copied in front of the payload into this rank's send buffer, the receive of the peer's
first message posted, then the send, both on the transport's tag; then it polls the two
requests with ``MPI_Test`` and, once both are complete, judges what arrived (its length and its
header). Ranks on this form and on mpi4py's therefore exchange the same bytes and pair up.
``swap_sum`` is a swap that then adds the peer's vector into this rank's (the fold a sum's swap
runs, ``mpi_swap.Fold``), each part in its operand order, and divides a mean, in the
vector's own float type: the bits of NumPy's ``add`` and ``divide`` (but for a NaN made of two
NaNs with different payloads, of which NumPy's loops keep either).

It calls the MPI functions of the library mpi4py loaded, by name (``MPI_Irecv``, ``MPI_Isend``,
``MPI_Test``, ``MPI_Get_count``), with the handles mpi4py holds (``MPI._handleof``): where
those are pointers, as in Open MPI, they pass as 64-bit words. ``mpi_compiled_swap`` loads the
library before this module's first kernel compiles or is read from Numba's cache, so that the
symbols resolve, and only for an MPI whose handles are pointers.

It hands back to Python what is rare: PENDING, the requests are not complete within the
``SPIN_NS`` word's nanoseconds (the caller waits for them with the timeout and the liveness
checks); MISMATCH, the message is not the one expected (the caller names the peer's call); a
negative value, the MPI error code of a call that failed (the caller turns it into the
transport's error). A swap that does not end DONE has not folded. ``state`` holds what a
peer's swaps share (the peer, the tag, the communicator's and MPI_BYTE's handles, the spin) and
what one swap leaves: the two requests, the flags of their completion, the received length, how
many requests were posted, a clock reading and a status.

Importing this module imports Numba.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types

DONE, PENDING, MISMATCH = 0, 1, 2
# the words of ``state``: set once per peer, then the receive's and the send's requests, their
# two int32 completion flags, the received length (int32), the requests posted, a timespec
# (two words), then an MPI_Status
PEER, TAG, COMM, BYTE, SPIN_NS, RECV, SEND, FLAGS, COUNT, POSTED, CLOCK = range(11)
STATUS = CLOCK + 2
STATUS_WORDS = 8  # room for an MPI_Status of up to 64 bytes (Open MPI's: 24)
STATE_WORDS = STATUS + STATUS_WORDS
POLLS_PER_CLOCK = 16  # tests between two readings of the clock

_post = types.int32(types.uintp, types.int32, types.uintp, types.int32, types.int32,
                    types.uintp, types.uintp)
_irecv = types.ExternalFunction("MPI_Irecv", _post)
_isend = types.ExternalFunction("MPI_Isend", _post)
_test = types.ExternalFunction("MPI_Test", types.int32(types.uintp, types.uintp, types.uintp))
_get_count = types.ExternalFunction("MPI_Get_count",
                                    types.int32(types.uintp, types.uintp, types.uintp))
_clock_gettime = types.ExternalFunction("clock_gettime", types.int32(types.int32, types.uintp))
CLOCK_MONOTONIC = 1  # Linux's
# C's own: Numba's slice assignment between two arrays took half again as long at 64 KiB
_memcpy = types.ExternalFunction("memcpy", types.uintp(types.uintp, types.uintp, types.uintp))


@njit(cache=True, nogil=True)
def swap(payload, header, packed, first, state):  # pragma: no cover
    """Send ``header`` + ``payload`` (bytes) to the peer through ``packed``, receive the peer's
    first message into ``first``, and poll both; DONE, PENDING, MISMATCH or -(MPI error code)
    (see the module's docstring)."""
    h, n = len(header), payload.size
    for i in range(h):
        packed[i] = header[i]
    _memcpy(packed.ctypes.data + h, payload.ctypes.data, n)
    where = state.ctypes.data
    peer, tag, comm, byte = state[PEER], state[TAG], state[COMM], state[BYTE]
    state[POSTED] = 0
    state[FLAGS] = 0
    state[COUNT] = 0
    error = _irecv(first.ctypes.data, first.size, byte, peer, tag, comm, where + 8 * RECV)
    if error != 0:
        return -error
    state[POSTED] = 1
    error = _isend(packed.ctypes.data, h + n, byte, peer, tag, comm, where + 8 * SEND)
    if error != 0:
        return -error
    state[POSTED] = 2
    return poll(header, first, n, state)


@njit(cache=True, nogil=True)
def swap_sum(buf, header, packed, first, state, split, low, high, mean):  # pragma: no cover
    """``swap`` of ``buf``'s bytes, then, when DONE, ``buf`` = the peer's vector + ``buf``:
    the peer's operand first below ``split`` where ``low``, from ``split`` on where ``high``;
    divided by ``mean`` where it is not 0."""
    code = swap(buf.view(np.uint8), header, packed, first, state)
    if code == DONE:
        h = len(header)
        got = first[h:h + buf.size * buf.itemsize].view(buf.dtype)
        _add_into(buf[:split], got[:split], low, mean)
        _add_into(buf[split:], got[split:], high, mean)
    return code


@njit(cache=True, nogil=True)
def _add_into(acc, got, theirs_first, mean):  # pragma: no cover
    """``acc = got + acc`` (``theirs_first``) or ``acc + got``, then ``/ mean`` unless 0. The
    sum is rounded to ``acc``'s type before the division: a float32 divided in float64 and
    rounded to float32 rounds as float32's own division would (53 >= 2 * 24 + 2 bits)."""
    n = acc.size
    if mean == 0:
        if theirs_first:
            for i in range(n):
                acc[i] = got[i] + acc[i]
        else:
            for i in range(n):
                acc[i] = acc[i] + got[i]
    elif theirs_first:
        for i in range(n):
            acc[i] = (got[i] + acc[i]) / mean
    else:
        for i in range(n):
            acc[i] = (acc[i] + got[i]) / mean


@njit(cache=True, nogil=True)
def poll(header, first, n, state):  # pragma: no cover
    """Test the requests of ``swap`` for up to the SPIN_NS word's nanoseconds (at least once);
    once both are complete, DONE when ``first`` holds ``header`` and ``n`` payload bytes, else
    MISMATCH; PENDING if not yet."""
    where = state.ctypes.data
    flags = state.view(np.int32)  # int32 words: 2 * FLAGS the receive's, + 1 the send's
    status, byte = where + 8 * STATUS, state[BYTE]
    deadline = _now(state) + state[SPIN_NS]
    polls = 0
    while polls % POLLS_PER_CLOCK != 0 or polls == 0 or _now(state) < deadline:
        polls += 1
        if flags[2 * FLAGS] == 0:
            error = _test(where + 8 * RECV, where + 8 * FLAGS, status)
            if error != 0:
                return -error
            if flags[2 * FLAGS] != 0:
                error = _get_count(status, byte, where + 8 * COUNT)
                if error != 0:
                    return -error
        if flags[2 * FLAGS + 1] == 0:
            error = _test(where + 8 * SEND, where + 8 * FLAGS + 4, status)
            if error != 0:
                return -error
        if flags[2 * FLAGS] != 0 and flags[2 * FLAGS + 1] != 0:
            h = len(header)
            if flags[2 * COUNT] != h + n:
                return MISMATCH
            for i in range(h):
                if first[i] != header[i]:
                    return MISMATCH
            return DONE
    return PENDING


@njit(cache=True, nogil=True)
def _now(state):  # pragma: no cover
    """CLOCK_MONOTONIC in nanoseconds, read through ``state``'s CLOCK words (a timespec)."""
    _clock_gettime(CLOCK_MONOTONIC, state.ctypes.data + 8 * CLOCK)
    return state[CLOCK] * 1_000_000_000 + state[CLOCK + 1]
