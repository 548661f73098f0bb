"""The mpi transport's two-rank all-reduce (``transports.mpi_pair``): the portable ring's bits in
one transport call (one exchange, the ring's two steps as two exchanges of whole halves, or the
pipeline of ``mpi_chained``), mismatches named, a dead peer named.

The pipeline's jobs force small pieces (``MIN_PIECE_BYTES``), no exchange and the pipeline at
every size (``PIPELINE_MIN_BYTES``), so that small vectors already span many pieces, a short
last one and more pieces than receive slots. The exchange's job lowers the swap's limit, so that
the larger vectors take the ``sendrecv`` an exchange above the swap's limit runs (a benchmark's
form). The halves' job turns the exchange off, so every vector takes the two exchanges of
halves that larger vectors take."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import mpi_available, run_ranks
from neural_arch.distributed.transports import mpi_chained, mpi_notices, mpi_wire

pytestmark = [pytest.mark.timeout(90),
              pytest.mark.skipif(not mpi_available(), reason="needs mpi4py and mpiexec")]

# elements: 1 (one rank's half empty), 2 (fewer than three ranks), odd, several pieces with a
# short last one, more pieces than the pipeline's receive slots
SIZES = (1, 2, 7, 1001, 6151)
DTYPES = (np.float32, np.float64, np.int32)
SWAP_TEST_BYTES = 4096  # swapped: sizes 1 to 7, and 1001 of 4-byte types; the rest sendrecv
HALF_PIECE_TEST_BYTES = 1000  # halves of 1001 and 6151 elements in several pieces
# the transport's calls are counted in their mpi4py forms (``test_mpi_compiled`` checks the
# compiled ones against those)
PYTHON_FORMS = {"NEURAL_ARCH_MPI_COMPILED": "python"}


def _values(rank: int, size: int, dtype) -> np.ndarray:
    """Random values with what tells operand orders apart: signed zeros (MAX), NaNs whose
    payloads name the rank, infinities."""
    rng = np.random.default_rng([rank, size])
    if np.dtype(dtype).kind == "i":
        return rng.integers(-50, 50, size).astype(dtype)
    x = (rng.standard_normal(size) * 100).astype(dtype)
    head = np.array([0.0, -0.0, np.inf, 1e30, -0.0], dtype)[:size]
    x[:head.size] = head if rank == 0 else -head[::-1]
    if size > 8:
        bits = x.view({4: np.uint32, 8: np.uint64}[x.itemsize])
        bits[7] = bits.dtype.type(~0 >> 1 & np.iinfo(bits.dtype).max) - rank  # a NaN per rank
    return x


def _bits_job(rank: int, world: int, form: str) -> dict:
    from neural_arch import distributed as dist
    from neural_arch.distributed.group.world import resolve_group
    from neural_arch.distributed.transports import mpi_pair
    if form == "pipeline":
        mpi_pair.EXCHANGE_MAX_BYTES, mpi_pair.MIN_PIECE_BYTES = 0, 256
        mpi_pair.PIPELINE_MIN_BYTES = 0
    elif form == "exchange":
        mpi_pair.SWAP_MAX_BYTES = SWAP_TEST_BYTES
    elif form == "halves":
        mpi_pair.EXCHANGE_MAX_BYTES = 0
    elif form == "pieces":  # halves of several pieces, the last one short
        mpi_pair.EXCHANGE_MAX_BYTES, mpi_pair.HALF_PIECE_BYTES = 0, HALF_PIECE_TEST_BYTES
    t = resolve_group(None).transport
    calls = {"send_recv_chained": [], "sendrecv": [], "swap": []}
    for name, found in calls.items():
        method = getattr(t, name)
        setattr(t, name, lambda *a, method=method, found=found: found.append(1) or method(*a))
    np.seterr(over="ignore", invalid="ignore")
    report = {"differ": [], "wrong": [], "calls": 0}
    for size in (0,) + SIZES:
        for dtype in DTYPES:
            everyone = [_values(r, size, dtype) for r in range(world)]
            for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVERAGE, dist.ReduceOp.MAX):
                if op is dist.ReduceOp.AVERAGE and np.dtype(dtype).kind != "f":
                    continue
                ours, portable = everyone[rank].copy(), everyone[rank].copy()
                dist.all_reduce(ours, op, algorithm="ring")
                t.ring_all_reduce = lambda *a: False  # the portable ring, as every transport
                before = len(calls["sendrecv"])
                try:
                    dist.all_reduce(portable, op, algorithm="ring")
                finally:
                    del t.ring_all_reduce
                    del calls["sendrecv"][before:]
                reference = {"SUM": np.sum, "AVERAGE": np.mean,
                             "MAX": np.max}[op.name](np.stack(everyone), axis=0)
                name = f"{size} x {np.dtype(dtype).name} {op.name}"
                if ours.tobytes() != portable.tobytes():
                    report["differ"].append(name)
                # NumPy sums in another order: float32 rounds differently near cancellations
                if not np.allclose(ours, reference, rtol=1e-6, atol=1e-3, equal_nan=True):
                    report["wrong"].append(name)
    report["calls"] = {name: len(found) for name, found in calls.items()}
    for name in calls:
        delattr(t, name)
    report.update(_recursive_doubling_bits(t, rank, world))
    if world == 2:  # different sizes on the two ranks: both named, on both ranks
        try:
            dist.all_reduce(np.ones(1000 + rank, np.float32), algorithm="ring")  # swapped
            report["mismatch"] = "no error"
        except dist.CollectiveMismatchError as e:
            report["mismatch"] = str(e)
    return report


def _recursive_doubling_bits(t, rank: int, world: int) -> dict:
    """Recursive doubling with each round a swap where the transport has one (up to the swap's
    limit), against its sendrecv form (``exchange_reduce`` turned off): the same bits, and
    NumPy's values; and how many swaps it made."""
    from neural_arch import distributed as dist
    swaps, exchange, swapping = [], t.exchange_reduce, [True]

    def counted(*a):
        done = swapping[0] and exchange(*a)
        swaps.extend([1] if done else [])
        return done
    t.exchange_reduce = counted
    found = {"rd_differ": [], "rd_wrong": []}
    try:
        for size in (0,) + SIZES:
            for dtype in DTYPES:
                everyone = [_values(r, size, dtype) for r in range(world)]
                for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX):
                    ours, plain = everyone[rank].copy(), everyone[rank].copy()
                    dist.all_reduce(ours, op, algorithm="recursive_doubling")
                    swapping[0] = False  # the sendrecv form
                    try:
                        dist.all_reduce(plain, op, algorithm="recursive_doubling")
                    finally:
                        swapping[0] = True
                    name = f"{size} x {np.dtype(dtype).name} {op.name}"
                    if ours.tobytes() != plain.tobytes():
                        found["rd_differ"].append(name)
                    reference = (np.sum if op.name == "SUM" else np.max)(np.stack(everyone), 0)
                    if not np.allclose(ours, reference, rtol=1e-6, atol=1e-3, equal_nan=True):
                        found["rd_wrong"].append(name)
    finally:
        del t.exchange_reduce
    found["rd_swaps"] = len(swaps)
    return found


@pytest.fixture(scope="module", params=[(2, "pipeline"), (2, "exchange"), (2, "halves"),
                                        (2, "pieces"), (3, "ring")],
                ids=["p2-pipeline", "p2-exchange", "p2-halves", "p2-pieces", "p3"])
def reports(request):
    world, form = request.param
    return request.param, run_ranks(_bits_job, world, "mpi", timeout=60, args=(form,),
                                    init_kwargs={"timeout": 20}, env=PYTHON_FORMS)


def test_all_reduce_keeps_the_portable_rings_bits_and_numpys_values(reports):
    _, per_rank = reports
    assert [(r["differ"], r["wrong"]) for r in per_rank] == [([], [])] * len(per_rank)


def test_recursive_doubling_swaps_each_round_with_the_bits_of_its_sendrecv_form(reports):
    (world, _), per_rank = reports
    assert [(r["rd_differ"], r["rd_wrong"]) for r in per_rank] == [([], [])] * world
    # a round per non-empty call: 5 sizes x 3 dtypes x 2 ops at p = 2, every one swapped; at
    # p = 3 rank 0 hands its vector to rank 1, and ranks 1 and 2 swap the vectors up to the
    # packed limit of three ranks (8 KiB: all but 6151 elements)
    expected = [30, 30] if world == 2 else [0, 24, 24]
    assert [r["rd_swaps"] for r in per_rank] == expected


def _pieces_calls() -> int:
    """sendrecv calls of the "pieces" form: two per piece of the larger half, every case."""
    calls = 0
    for size in SIZES:
        for dtype, ops in ((np.float32, 3), (np.float64, 3), (np.int32, 2)):
            step = HALF_PIECE_TEST_BYTES // np.dtype(dtype).itemsize
            calls += ops * 2 * -(-(-(-size // 2)) // step)
    return calls


def test_two_ranks_run_each_all_reduce_as_its_forms_transport_calls(reports):
    (world, form), per_rank = reports
    # one call per non-empty all-reduce at p = 2: 5 sizes x (3 dtypes x 3 ops - 1 AVERAGE);
    # exchanged: 3 sizes x 8 and 1001 x (float32 x 3 + int32 x 2) swapped, the rest sendrecv;
    # halves: two sendrecv calls each
    expected = {"pipeline": {"send_recv_chained": 40, "sendrecv": 0, "swap": 0},
                "exchange": {"send_recv_chained": 0, "sendrecv": 11, "swap": 29},
                "halves": {"send_recv_chained": 0, "sendrecv": 80, "swap": 0},
                "pieces": {"send_recv_chained": 0, "sendrecv": _pieces_calls(),
                           "swap": 0}}.get(form)
    for r in per_rank:
        if expected is None:  # three ranks: the portable ring's messages
            assert r["calls"]["send_recv_chained"] == r["calls"]["swap"] == 0 and \
                r["calls"]["sendrecv"] > 40, r
        else:
            assert r["calls"] == expected, r["calls"]


# the two-rank jobs of ``reports`` only: the mismatch is what the two-rank forms check
@pytest.mark.parametrize("reports", [(2, "pipeline"), (2, "exchange"), (2, "halves"),
                                     (2, "pieces")], indirect=True,
                         ids=["p2-pipeline", "p2-exchange", "p2-halves", "p2-pieces"])
def test_different_sizes_on_two_ranks_raise_naming_both(reports):
    _, per_rank = reports
    for r in per_rank:
        assert "1000 x float32" in r["mismatch"] and "1001 x float32" in r["mismatch"], r


def test_payloads_have_a_tag_of_their_own():
    # a notice poll (Iprobe of any source on the notices' tag) would swallow a payload
    assert len({mpi_chained.CHAIN_TAG, mpi_wire.TAG, mpi_notices.TAG}) == 3


def _death_job(rank: int, world: int) -> dict:
    import os
    import signal
    import time
    from neural_arch import distributed as dist
    from neural_arch.distributed.transports import mpi_pair
    mpi_pair.EXCHANGE_MAX_BYTES, mpi_pair.MIN_PIECE_BYTES = 0, 256
    mpi_pair.PIPELINE_MIN_BYTES = 0
    dist.barrier()
    if rank == 1:
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    try:
        dist.all_reduce(np.ones(100_000, np.float32), algorithm="ring")
        return {"error": None}
    except dist.PeerFailureError as e:
        return {"error": type(e).__name__, "peer": e.peer, "seconds": time.monotonic() - start}


def test_a_killed_peer_is_named_within_the_timeout():
    survivor = run_ranks(_death_job, 2, "mpi", timeout=60, init_kwargs={"timeout": 10},
                         may_die=[1])[0]
    assert survivor["error"] == "PeerFailureError" and survivor["peer"] == 1, survivor
    assert survivor["seconds"] < 10, survivor
