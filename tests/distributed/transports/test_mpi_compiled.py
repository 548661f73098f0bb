"""The mpi transport's compiled exchanges (``transports.mpi_compiled``, ``mpi_kernels``): the
bits of the mpi4py forms, ranks on either form pairing up, the message on the wire, a late
peer waited for, mismatches named, a missing peer timed out.

Each rank opens three transports: one compiling its swaps from the first (``compiled``), one
never (``python``), and one compiling on even ranks only (``mixed``), and runs the same
all-reduces on each: recursive doubling below 64 KiB (each round a swap, up to 8 KiB beyond two
ranks), the two-rank ring's whole-vector swap up to 256 KiB, its two steps above."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest

from dist_harness import mpi_available, run_ranks
from neural_arch.distributed.transports import mpi_compiled

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")]
HAVE_NUMBA = importlib.util.find_spec("numba") is not None

# elements: one (a rank's half empty), two, odd, past the wire's packed 8 KiB, and the swap's
# largest (256 KiB of float32), and above it (512 KiB: the two steps)
SIZES_P2 = (1, 2, 7, 1001, 4099, 65536, 131072)
SIZES_P4 = (1, 3, 1001)  # beyond two ranks a swap carries at most 8 KiB
DTYPES = (np.float32, np.float64, np.int64, np.int32, np.float16)
KERNELS = ("swap", "swap_sum", "sendrecv", "ring_steps")  # the calls into ``mpi_kernels``


def _values(rank: int, size: int, dtype) -> np.ndarray:
    """Random values with what tells operand orders and roundings apart: signed zeros,
    infinities, magnitudes that cancel."""
    rng = np.random.default_rng([rank, size, np.dtype(dtype).num])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size).astype(dtype)
    x = (rng.standard_normal(size) * 10.0 ** rng.integers(-3, 3, size)).astype(dtype)
    head = np.array([0.0, -0.0, np.inf, 3e3, -0.0], dtype)[:size]
    x[:head.size] = head if rank == 0 else -head[::-1]
    return x


def _drain(t, src: int, nbytes: int) -> None:
    """Receive the message ``src`` sent ``t`` for no one (if MPI did not cancel its send)."""
    import time
    from mpi4py import MPI
    from neural_arch.distributed.transports import mpi_wire
    deadline = time.monotonic() + 2
    while time.monotonic() < deadline:
        if t.comm.Iprobe(src, mpi_wire.TAG):
            t.comm.Recv([bytearray(nbytes), MPI.BYTE], src, mpi_wire.TAG)
            return
        time.sleep(0.01)


def _transports(rank: int) -> dict:
    from neural_arch.distributed.transports import mpi
    made = {}
    for name, mode in (("compiled", "compiled"), ("python", "python"),
                       ("mixed", "compiled" if rank % 2 == 0 else "python")):
        os.environ[mpi_compiled.ENV_CHOICE] = mode  # read as the transport is made
        made[name] = mpi.create(timeout=20)
    os.environ.pop(mpi_compiled.ENV_CHOICE)
    return made


def _bits_job(rank: int, world: int) -> dict:
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports import mpi_kernels
    from neural_arch.distributed.transports.base import Fingerprint
    from mpi4py import MPI
    made = _transports(rank)
    mpi_compiled.kernels(MPI)  # loaded (and checked) before its calls are counted
    kernel_calls = []
    for name in KERNELS:  # counted: the compiled form must be the one that ran
        kernel = getattr(mpi_kernels, name)
        setattr(mpi_kernels, name,
                lambda *a, kernel=kernel, name=name: kernel_calls.append(name) or kernel(*a))
    np.seterr(over="ignore", invalid="ignore")
    report = {"why": mpi_compiled.why_not_compiled(), "differ": [], "wrong": [],
              "kernels": {}}
    seq = 0
    for size in SIZES_P2 if world == 2 else SIZES_P4:
        for dtype in DTYPES:
            everyone = [_values(r, size, dtype) for r in range(world)]
            for op in (ReduceOp.SUM, ReduceOp.AVERAGE, ReduceOp.MAX):
                if op is ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                    continue
                seq += 1
                results = {}
                for name, t in made.items():
                    before = len(kernel_calls)
                    buf = everyone[rank].copy()
                    algorithms.all_reduce(t, buf, op,
                                          Fingerprint("all_reduce", seq, buf.dtype.name, size))
                    results[name] = buf
                    counted = report["kernels"].setdefault(name, dict.fromkeys(KERNELS, 0))
                    for call in kernel_calls[before:]:
                        counted[call] += 1
                case = f"{size} x {np.dtype(dtype).name} {op.name}"
                if len({buf.tobytes() for buf in results.values()}) != 1:
                    report["differ"].append(case)
                wide = np.stack(everyone).astype(np.float64)
                reference = {"SUM": np.sum, "AVERAGE": np.mean, "MAX": np.max}[op.name](wide, 0)
                tolerance = 1e-2 if dtype == np.float16 else 1e-5
                if not np.allclose(results["compiled"].astype(np.float64), reference,
                                   rtol=tolerance, atol=tolerance * 1e3, equal_nan=True):
                    report["wrong"].append(case)
    for each in made.values():
        each.close()
    return report


@pytest.fixture(scope="module", params=[2, 4], ids=["p2", "p4"])
def bits(request):
    return request.param, run_ranks(_bits_job, request.param, "mpi", timeout=90,
                                    init_kwargs={"timeout": 20})


def test_compiled_swaps_keep_the_bits_of_mpi4pys_and_numpys_values(bits):
    world, per_rank = bits
    assert [(r["differ"], r["wrong"]) for r in per_rank] == [([], [])] * world


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled swaps need Numba (the 'fast' extra)")
def test_the_compiled_form_ran_where_asked_and_folded_float_sums_itself(bits):
    world, per_rank = bits
    expected = _kernel_calls(world)
    for rank, r in enumerate(per_rank):
        assert r["why"] == "", r["why"]
        assert r["kernels"]["python"] == dict.fromkeys(KERNELS, 0), r["kernels"]
        for form in ("compiled", "mixed") if rank % 2 == 0 else ("compiled",):
            got = dict(r["kernels"][form])
            # a ``ring_steps`` whose first step waited for a late peer sends its second as a
            # ``sendrecv``
            late = got["sendrecv"] - expected["sendrecv"]
            assert 0 <= late <= expected["ring_steps"], (form, got, expected)
            assert {**got, "sendrecv": expected["sendrecv"]} == expected, (form, got, expected)
        if rank % 2:
            assert r["kernels"]["mixed"] == dict.fromkeys(KERNELS, 0), r["kernels"]["mixed"]


def _kernel_calls(world: int) -> dict:
    """The kernel calls of a rank's ``_bits_job`` on a compiled transport. Up to the swap's
    limit (256 KiB at p = 2, 8 KiB beyond) a swap per round (one at p = 2, two at p = 4):
    ``swap_sum`` for float32, float64 and int64 SUM and AVERAGE (folded in the kernel),
    ``swap`` for the rest (folded after it). Above it (p = 2) the ring's two steps:
    ``ring_steps`` for such a sum, else two ``sendrecv`` calls with the fold between."""
    calls = dict.fromkeys(KERNELS, 0)
    limit, rounds = (256 << 10, 1) if world == 2 else (8 << 10, 2)
    for size in SIZES_P2 if world == 2 else SIZES_P4:
        for dtype in DTYPES:
            for op in ("SUM", "AVERAGE", "MAX"):
                if op == "AVERAGE" and np.dtype(dtype).kind != "f":
                    continue
                summed = dtype in (np.float32, np.float64, np.int64) and op != "MAX"
                if size * np.dtype(dtype).itemsize <= limit:
                    calls["swap_sum" if summed else "swap"] += rounds
                elif summed:
                    calls["ring_steps"] += 1
                else:
                    calls["sendrecv"] += 2
    return calls


def _wire_job(rank: int, world: int) -> dict:
    """The compiled form's message on the wire, a late peer, mismatches, a timeout."""
    import time
    from mpi4py import MPI
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.errors import CollectiveMismatchError, CollectiveTimeoutError
    from neural_arch.distributed.reduce_ops import ReduceOp
    from neural_arch.distributed.transports import mpi, mpi_wire
    from neural_arch.distributed.transports.base import HEADER_SIZE, Fingerprint, \
        pack_header, unpack_header
    os.environ[mpi_compiled.ENV_CHOICE] = "compiled"
    t, other, alone = mpi.create(timeout=20), mpi.create(timeout=20), mpi.create(timeout=20)
    found = {"late": [], "errors": []}
    fp = Fingerprint("all_reduce", 3, "float32", 16384)
    mine = _values(rank, 16384, np.float32)
    # a peer arriving late, either one: the kernel stops polling and the wait finishes the swap
    # (1 and 16384 elements), or the ring's first step, then folds and sends the second (131072
    # elements, 512 KiB)
    for seq, (late, size) in enumerate(((0, 1), (1, 1), (0, 16384), (1, 16384), (0, 131072),
                                        (1, 131072))):
        buf = _values(rank, 131072, np.float32)[:size]
        if rank == late:
            time.sleep(0.05)
        algorithms.all_reduce(t, buf, ReduceOp.SUM, Fingerprint("all_reduce", seq, "float32",
                                                                size))
        expected = _values(0, 131072, np.float32)[:size] + _values(1, 131072, np.float32)[:size]
        found["late"].append(bool(np.array_equal(buf, expected, equal_nan=True)))
    # the message: header and payload in one MPI message, as mpi4py's form sends it
    if rank == 0:
        t.swap(mine, 1, fp, lambda theirs: None)
    else:
        raw = bytearray(HEADER_SIZE + mine.nbytes)
        t.comm.Recv([raw, MPI.BYTE], 0, mpi_wire.TAG)
        found["wire"] = (unpack_header(bytes(raw[:HEADER_SIZE])) == (fp, mine.nbytes) and
                         raw[HEADER_SIZE:] == _values(0, 16384, np.float32).tobytes())
        t.comm.Send([bytearray(pack_header(fp, mine.nbytes)) + mine.tobytes(), MPI.BYTE], 0,
                    mpi_wire.TAG)
    # another size on each rank (both named), and a header alone where a swap was expected
    try:
        algorithms.all_reduce(other, np.ones(1000 + rank, np.float32), ReduceOp.SUM,
                              Fingerprint("all_reduce", 9, "float32", 1000 + rank))
    except CollectiveMismatchError as e:
        found["errors"].append(str(e))
    if rank == 0:
        try:
            alone.swap(mine, 1, fp, lambda theirs: None)
        except CollectiveMismatchError as e:
            found["errors"].append(str(e))
    else:
        alone.comm.Send([bytearray(pack_header(fp, mine.nbytes)), MPI.BYTE], 0, mpi_wire.TAG)
        raw = bytearray(HEADER_SIZE + mine.nbytes)
        alone.comm.Recv([raw, MPI.BYTE], 0, mpi_wire.TAG)  # rank 0's swap, for no one
    # a peer that never comes: the timeout names it
    timed_out = mpi.create(timeout=0.5)
    if rank == 0:
        try:
            timed_out.swap(mine[:4].copy(), 1, Fingerprint("reduce", 5, "float32", 4),
                           lambda theirs: None)
        except CollectiveTimeoutError as e:
            found["timeout"] = (e.peer, e.op, e.seq, str(e))
    t.native_collectives().barrier()
    if rank == 1:
        _drain(timed_out, 0, HEADER_SIZE + 16)
    for each in (t, other, alone, timed_out):
        each.close()
    return found


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled swaps need Numba (the 'fast' extra)")
def test_the_compiled_form_on_the_wire_late_peers_mismatches_and_timeouts():
    per_rank = run_ranks(_wire_job, 2, "mpi", timeout=90, init_kwargs={"timeout": 20})
    for rank, found in enumerate(per_rank):
        assert found["late"] == [True] * 6, found
        sizes = sorted(str(e) for e in found["errors"])
        assert any("1000 x float32" in e and "1001 x float32" in e for e in sizes), sizes
    assert per_rank[1]["wire"] is True
    assert any("sent a header alone for all_reduce #3" in e and
               "where a packed swap of 65536 bytes was expected" in e
               for e in per_rank[0]["errors"]), per_rank[0]["errors"]
    peer, op, seq, message = per_rank[0]["timeout"]
    assert (peer, op, seq) == (1, "reduce", 5) and "within 0.5 s" in message, per_rank[0]


def test_the_choice_of_form_is_checked(monkeypatch):
    monkeypatch.setenv(mpi_compiled.ENV_CHOICE, "fastest")
    with pytest.raises(ValueError, match="NEURAL_ARCH_MPI_COMPILED='fastest'; use one of auto"):
        mpi_compiled.choice()
    for value, expected in (("", "auto"), (" Compiled ", "compiled"), ("python", "python")):
        monkeypatch.setenv(mpi_compiled.ENV_CHOICE, value)
        assert mpi_compiled.choice() == expected


def _sendrecv_job(rank: int, world: int) -> dict:
    """Sendrecvs around the ring (to the right, from the left), packed (up to 8 KiB) and not,
    on every pair of forms; a late sender; sizes that differ, in either form; a timeout."""
    import time
    from neural_arch.distributed.errors import CollectiveMismatchError, CollectiveTimeoutError
    from neural_arch.distributed.transports import mpi_kernels
    from mpi4py import MPI
    from neural_arch.distributed.transports.base import HEADER_SIZE, Fingerprint
    made = _transports(rank)
    mpi_compiled.kernels(MPI)  # loaded (and checked) before its calls are counted
    calls = []
    kernel = mpi_kernels.sendrecv
    mpi_kernels.sendrecv = lambda *a: calls.append(1) or kernel(*a)
    right, left = (rank + 1) % world, (rank - 1) % world
    found = {"wrong": [], "calls": {}, "errors": []}
    seq = 0
    for size, dtype in ((0, np.float64), (1, np.float32), (7, np.int32), (2048, np.float32),
                        (2049, np.float32), (4099, np.float64), (70001, np.float16)):
        for name, t in made.items():
            seq += 1
            before = len(calls)
            got = np.full(size, 99, dtype)
            if rank == 0 and seq % 3 == 0:
                time.sleep(0.02)  # a late sender: its peer's kernel hands over to the wait
            t.sendrecv(_values(rank, size, dtype), right, got, left,
                       Fingerprint("ring", seq, np.dtype(dtype).name, size))
            if got.tobytes() != _values(left, size, dtype).tobytes():
                found["wrong"].append(f"{name}: {size} x {np.dtype(dtype).name}")
            found["calls"][name] = found["calls"].get(name, 0) + len(calls) - before
    # each rank sends and expects its own size, so that what comes from the left is another
    # size on every rank: packed (1000 + rank float32) and not (10000 + rank)
    from neural_arch.distributed.transports import mpi, mpi_wire
    os.environ[mpi_compiled.ENV_CHOICE] = "compiled"
    fresh = [mpi.create(timeout=20) for _ in range(2)]  # a mismatch leaves a peer unusable
    timed_out = mpi.create(timeout=0.5)
    os.environ.pop(mpi_compiled.ENV_CHOICE)
    for size, t in zip((1000, 10000), fresh):
        seq += 1
        try:
            t.sendrecv(np.zeros(size + rank, np.float32), right,
                       np.zeros(size + rank, np.float32), left,
                       Fingerprint("ring", seq, "float32", size + rank))
        except CollectiveMismatchError as e:
            found["errors"].append((size, str(e)))
        if size * 4 > mpi_wire.PACKED_MAX_BYTES:  # the left's payload, after its header
            t.comm.Recv([np.empty(size + left, np.float32), MPI.BYTE], left, mpi_wire.TAG)
    if rank == 0:
        try:
            timed_out.sendrecv(np.zeros(3), 1, np.zeros(3), 1,
                               Fingerprint("ring", 1, "float64", 3))
        except CollectiveTimeoutError as e:
            found["timeout"] = (e.peer, e.op, str(e))
    made["python"].native_collectives().barrier()
    if rank == 1:
        _drain(timed_out, 0, HEADER_SIZE + 24)
    for each in (*made.values(), *fresh, timed_out):
        each.close()
    return found


@pytest.mark.skipif(not HAVE_NUMBA, reason="the compiled sendrecvs need Numba (the 'fast' extra)")
@pytest.mark.parametrize("world", [2, 3])
def test_compiled_sendrecvs_around_the_ring(world):
    per_rank = run_ranks(_sendrecv_job, world, "mpi", timeout=90, init_kwargs={"timeout": 20})
    for rank, found in enumerate(per_rank):
        assert found["wrong"] == [], found
        assert found["calls"] == {"compiled": 7, "python": 0, "mixed": 7 * (rank % 2 == 0)}, found
        left = (rank - 1) % world
        assert [size for size, _ in found["errors"]] == [1000, 10000], found
        for size, e in found["errors"]:
            assert f"{size + rank} x float32" in e and f"{size + left} x float32" in e, e
    peer, op, message = per_rank[0]["timeout"]
    assert (peer, op) == (1, "ring") and "within 0.5 s" in message, per_rank[0]
