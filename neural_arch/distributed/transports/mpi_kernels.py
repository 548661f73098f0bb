"""The mpi transport's exchanges (``mpi_compiled``) as compiled calls into the MPI library.

``swap`` takes the steps ``mpi_swap.swap`` takes through mpi4py, on the same messages: the
header copied in front of the payload into this rank's send buffer, the receive of the peer's
first message posted, then the send, both on the transport's tag; then it polls the requests
with ``MPI_Test`` and, once both are complete, judges what arrived (its length and its
header). ``sendrecv`` is the wire's ``sendrecv`` (``mpi_wire``): a payload of up to the
PACKED_MAX word's size packed behind its header, a larger one as a message of its own after
it, received only once its header was judged. Ranks on these forms and on mpi4py's exchange
the same bytes and pair up. ``swap_sum`` is a swap that then adds the peer's vector into this
rank's (the fold of a sum's swap, ``mpi_swap.Fold``), each part in its operand order, and
divides a mean; ``round_sum`` is one on a header made once, its seq written in;
``ring_steps`` is the two-rank ring's two ``sendrecv``s with that fold between. All three
compute in the vector's own float type: the bits of NumPy's ``add`` and ``divide`` (but for a
NaN made of two NaNs with different payloads, of which NumPy's loops keep either).

It calls the MPI functions of the library mpi4py loaded, by name (``MPI_Irecv``, ``MPI_Isend``,
``MPI_Test``, ``MPI_Get_count``), with the handles mpi4py holds (``MPI._handleof``): where
those are pointers, as in Open MPI, they pass as 64-bit words. ``mpi_compiled`` loads the
library before this module's first kernel compiles or is read from Numba's cache, so that the
symbols resolve, and only for an MPI whose handles are pointers.

It hands back to Python what is rare: PENDING, the requests are not complete within the spin
(the caller waits for them with the timeout and the liveness checks, polling with ``poll`` or
``poll_sendrecv``); MISMATCH, a first message that is not the one expected (the caller names
the peer's call); a negative value, the MPI error code of a call that failed (the caller turns
it into the transport's error). A call that does not end DONE has not folded (``ring_steps``:
its STEP word says which step stopped). ``state`` holds what the calls share (the swap's peer,
the tag, the communicator's and MPI_BYTE's handles, the spin, the packed size) and what one
call leaves (see the word names below).

Importing this module imports Numba.
"""
from __future__ import annotations

import numpy as np
from numba import njit, types

DONE, PENDING, MISMATCH = 0, 1, 2
# the words of ``state``: set once (the swap's peer, the tag, the communicator's and MPI_BYTE's
# handles, how long a call polls and after how long each poll yields the core, the largest
# packed payload, where four requests live: the handles inside four ``MPI.Request`` objects,
# so that what MPI completes and frees is seen by those objects too), then what one call
# leaves: the requests (the first message's receive, the first message's send, a payload's
# send, a payload's receive), their int32 completion flags (two words), the received length
# (int32), a bit per request posted, the step ``ring_steps`` is at, a timespec (two words),
# then an MPI_Status; last, set once too, where a header's seq lies (``base.SEQ_OFFSET``: a word
# here rather than a constant, so that no other module's value is frozen into the cached code)
PEER, TAG, COMM, BYTE, SPIN_NS, YIELD_NS, PACKED_MAX, REQS, FLAGS = 0, 1, 2, 3, 4, 5, 6, 7, 11
COUNT, POSTED, STEP, CLOCK, STATUS = 13, 14, 15, 16, 18
FIRST_IN, FIRST_OUT, PAYLOAD_OUT, PAYLOAD_IN = range(4)  # the requests, in REQS and FLAGS
STATUS_WORDS = 8  # room for an MPI_Status of up to 64 bytes (Open MPI's: 24)
SEQ_AT = STATUS + STATUS_WORDS
STATE_WORDS = SEQ_AT + 1
POLLS_PER_CLOCK = 16  # tests between two readings of the clock

_post = types.int32(types.uintp, types.int32, types.uintp, types.int32, types.int32,
                    types.uintp, types.uintp)
_irecv = types.ExternalFunction("MPI_Irecv", _post)
_isend = types.ExternalFunction("MPI_Isend", _post)
_mpi_test = types.ExternalFunction("MPI_Test", types.int32(types.uintp, types.uintp, types.uintp))
_get_count = types.ExternalFunction("MPI_Get_count",
                                    types.int32(types.uintp, types.uintp, types.uintp))
_clock_gettime = types.ExternalFunction("clock_gettime", types.int32(types.int32, types.uintp))
_sched_yield = types.ExternalFunction("sched_yield", types.int32())
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
    peer = state[PEER]
    _reset(state)
    error = _post_receive(first, first.size, peer, state, FIRST_IN)
    if error == 0:
        error = _post_send(packed, h + n, peer, state, FIRST_OUT)
    if error != 0:
        return -error
    return poll(header, first, n, state, state[SPIN_NS])


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
def round_sum(buf, header, seq, packed, first, state, low, mean):  # pragma: no cover
    """``swap_sum`` of the whole of ``buf`` (the peer's operand first where ``low``) with
    ``header``'s seq (8 bytes, little-endian, at the SEQ_AT word's offset) set to ``seq``
    first: a round of recursive doubling whose header is made once per shape
    (``mpi_compiled.CompiledExchanges.round_plan``)."""
    at = state[SEQ_AT]
    for i in range(8):
        header[at + i] = (seq >> (8 * i)) & 0xFF
    return swap_sum(buf, header, packed, first, state, buf.size, low, False, mean)


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
def poll(header, first, n, state, spin_ns):  # pragma: no cover
    """Test the requests of ``swap`` for up to ``spin_ns`` nanoseconds (at least once,
    yielding the core before each test past the YIELD_NS word's nanoseconds); once
    both are complete, DONE when ``first`` holds ``header`` and ``n`` payload bytes, else
    MISMATCH; PENDING if not yet."""
    flags = state.view(np.int32)
    start, polls, yielding = _now(state), 0, 0
    while True:
        error = _test(state, FIRST_IN)
        if error == 0:
            error = _test(state, FIRST_OUT)
        if error != 0:
            return -error
        if flags[2 * FLAGS + FIRST_IN] != 0 and flags[2 * FLAGS + FIRST_OUT] != 0:
            return DONE if _is_expected(first, flags[2 * COUNT], header, n) else MISMATCH
        polls += 1
        yielding = _pace(state, start, polls, spin_ns, yielding)
        if yielding < 0:
            return PENDING


@njit(cache=True, nogil=True)
def sendrecv(send, header, packed, dst, recv, expected, first, src, state):  # pragma: no cover
    """The wire's ``sendrecv``: ``send`` (bytes) to ``dst`` with ``header``, packed behind it
    into ``packed`` up to the PACKED_MAX word's size, else as a message of its own after the
    header; ``recv`` (bytes) from ``src``, whose first message lands in ``first`` and must be
    ``expected`` (with the payload behind it when packed) before the payload's own receive is
    posted. DONE, PENDING (take it up with ``poll_sendrecv``), MISMATCH or -(MPI error
    code)."""
    h, n = len(header), send.size
    for i in range(h):
        packed[i] = header[i]
    alone = n > state[PACKED_MAX]
    if not alone:
        _memcpy(packed.ctypes.data + h, send.ctypes.data, n)
    _reset(state)
    error = _post_receive(first, first.size, src, state, FIRST_IN)
    if error == 0:
        error = _post_send(packed, h if alone else h + n, dst, state, FIRST_OUT)
    if error == 0 and alone:
        error = _post_send(send, n, dst, state, PAYLOAD_OUT)
    if error != 0:
        return -error
    return poll_sendrecv(expected, first, recv, src, state, state[SPIN_NS])


@njit(cache=True, nogil=True)
def poll_sendrecv(expected, first, recv, src, state, spin_ns):  # pragma: no cover
    """Move ``sendrecv`` on for up to ``spin_ns`` nanoseconds (at least one poll, as ``poll``
    yields): once the
    first message is here and expected, copy a packed payload out of it or post the payload's
    receive; DONE once every request posted is complete, MISMATCH at once for a first message
    that is not the one expected (sends may still be in flight), else PENDING."""
    flags = state.view(np.int32)
    n, h = recv.size, len(expected)
    alone = n > state[PACKED_MAX]
    start, polls, yielding = _now(state), 0, 0
    while True:
        if flags[2 * FLAGS + FIRST_IN] == 0:
            error = _test(state, FIRST_IN)
            if error != 0:
                return -error
            if flags[2 * FLAGS + FIRST_IN] != 0:
                if not _is_expected(first, flags[2 * COUNT], expected, 0 if alone else n):
                    return MISMATCH
                if alone:
                    error = _post_receive(recv, n, src, state, PAYLOAD_IN)
                    if error != 0:
                        return -error
                else:
                    _memcpy(recv.ctypes.data, first.ctypes.data + h, n)
        done = flags[2 * FLAGS + FIRST_IN] != 0  # and judged, above
        for request in range(FIRST_OUT, PAYLOAD_IN + 1):
            error = _test(state, request)
            if error != 0:
                return -error
            done = done and (state[POSTED] >> request & 1 == 0
                             or flags[2 * FLAGS + request] != 0)
        if done:
            return DONE
        polls += 1
        yielding = _pace(state, start, polls, spin_ns, yielding)
        if yielding < 0:
            return PENDING


@njit(cache=True, nogil=True)
def ring_steps(mine, theirs, got, to_peer, from_peer, packed, first, peer, state,
               mean):  # pragma: no cover
    """The two-rank ring's two steps (``mpi_pair.halves_all_reduce``) as two ``sendrecv``s
    with a sum between: ``theirs`` to the peer with header ``to_peer`` while the peer's part
    of ``mine`` lands in ``got`` (header ``from_peer``); ``mine`` = ``got`` + ``mine`` (the
    peer's operand first), divided by ``mean`` unless 0; then ``mine`` to the peer while the
    peer's reduced part lands in ``theirs``. The STEP word says which step a code other than
    DONE comes from (1: nothing folded yet, 2: folded)."""
    state[STEP] = 1
    code = sendrecv(theirs.view(np.uint8), to_peer, packed, peer, got.view(np.uint8),
                    from_peer, first, peer, state)
    if code != DONE:
        return code
    _add_into(mine, got, True, mean)
    state[STEP] = 2
    return sendrecv(mine.view(np.uint8), from_peer, packed, peer, theirs.view(np.uint8),
                    to_peer, first, peer, state)


@njit(cache=True, nogil=True)
def _reset(state):  # pragma: no cover
    state[FLAGS] = 0
    state[FLAGS + 1] = 0
    state[COUNT] = 0
    state[POSTED] = 0


@njit(cache=True, nogil=True)
def _post_receive(buf, nbytes, src, state, request):  # pragma: no cover
    error = _irecv(buf.ctypes.data, nbytes, state[BYTE], src, state[TAG], state[COMM],
                   state[REQS + request])
    if error == 0:
        state[POSTED] |= 1 << request
    return error


@njit(cache=True, nogil=True)
def _post_send(buf, nbytes, dst, state, request):  # pragma: no cover
    error = _isend(buf.ctypes.data, nbytes, state[BYTE], dst, state[TAG], state[COMM],
                   state[REQS + request])
    if error == 0:
        state[POSTED] |= 1 << request
    return error


@njit(cache=True, nogil=True)
def _test(state, request):  # pragma: no cover
    """MPI_Test of a posted request not yet complete; the first message's length read at
    once."""
    flags = state.view(np.int32)
    if state[POSTED] >> request & 1 == 0 or flags[2 * FLAGS + request] != 0:
        return 0
    where = state.ctypes.data
    error = _mpi_test(state[REQS + request], where + 8 * FLAGS + 4 * request,
                      where + 8 * STATUS)
    if error == 0 and request == FIRST_IN and flags[2 * FLAGS + FIRST_IN] != 0:
        error = _get_count(where + 8 * STATUS, state[BYTE], where + 8 * COUNT)
    return error


@njit(cache=True, nogil=True)
def _is_expected(first, count, header, n):  # pragma: no cover
    """Whether the ``count`` bytes in ``first`` are ``header`` and ``n`` payload bytes."""
    h = len(header)
    if count != h + n:
        return False
    for i in range(h):
        if first[i] != header[i]:
            return False
    return True


@njit(cache=True, nogil=True)
def _pace(state, start, polls, spin_ns, yielding):  # pragma: no cover
    """After ``polls`` polls of a loop begun at ``start``: -1 once ``spin_ns`` nanoseconds
    have passed (the clock read every POLLS_PER_CLOCK polls, or after a single one when
    ``spin_ns`` is 0), else whether the loop yields the core before each poll from now on (past
    the YIELD_NS word's nanoseconds; it yields here, before the next poll)."""
    if polls % POLLS_PER_CLOCK == 0 or spin_ns == 0:
        waited = _now(state) - start
        if waited >= spin_ns:
            return -1
        yielding = 1 if waited >= state[YIELD_NS] else 0
    if yielding:
        _sched_yield()
    return yielding


@njit(cache=True, nogil=True)
def _now(state):  # pragma: no cover
    """CLOCK_MONOTONIC in nanoseconds, read through ``state``'s CLOCK words (a timespec)."""
    _clock_gettime(CLOCK_MONOTONIC, state.ctypes.data + 8 * CLOCK)
    return state[CLOCK] * 1_000_000_000 + state[CLOCK + 1]
