"""Collectives that keep their working memory out of the caller's input, over many pieces.

The ring's reduce-scatter carries its partial sums in the output (``ring._reduce_scatter_into``)
and the tree's reduce folds, below the root, into segments of the thread's scratch. With
``exchange.SEGMENT_BYTES`` lowered every vector spans many pieces and windows, the last ones
short; the inputs must come back unchanged, the results must equal NumPy's, and the
reduce-scatter's bits must be those of the ring run in place on a copy of the input.
"""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.algorithms import exchange, ring, tree
from neural_arch.distributed.reduce_ops import ReduceOp
from test_algorithms import fp
from threaded_transport import ThreadedTransport, batched_send_recv_many, run_threads

PIECE_BYTES = 96  # 12 float64 a piece, 8 pieces a ring window
M = 1009  # elements a block: several windows, the last one short


def _signed_inputs(n: int) -> list[np.ndarray]:
    """Floats of mixed magnitudes (a sum's order shows in its bits) with zeros of both signs
    (MAX's order of operands shows in the sign it keeps)."""
    rng = np.random.default_rng(n)
    inputs = [rng.standard_normal(n * M) * 10.0 ** rng.integers(-6, 6, n * M)
              for _ in range(n)]
    for r, x in enumerate(inputs):
        x[::7] = 0.0 if r % 2 else -0.0
    return inputs


@pytest.mark.parametrize("batched", [False, True], ids=["piece-by-piece", "windows"])
@pytest.mark.parametrize("n", [2, 3, 5])
def test_ring_reduce_scatter_reads_its_input_only_with_the_bits_of_the_ring_on_a_copy(
        n, batched, monkeypatch):
    monkeypatch.setattr(exchange, "SEGMENT_BYTES", PIECE_BYTES)
    if batched:  # the ring hands a window of pieces to the transport in one call
        monkeypatch.setattr(ThreadedTransport, "send_recv_many", batched_send_recv_many,
                            raising=False)
    inputs = _signed_inputs(n)
    bounds = [(i * M, (i + 1) * M) for i in range(n)]

    def body(t):
        r, found = t.rank, []
        for op in (ReduceOp.SUM, ReduceOp.MAX):
            src = inputs[r].copy()
            apart = np.empty(M)
            ring.reduce_scatter(t, src, apart, op, fp(n * M))
            assert src.tobytes() == inputs[r].tobytes()
            work = inputs[r].copy()  # the ring in place on a copy: the form it replaces
            ring._reduce_scatter_inplace(t, work, bounds, op, fp(n * M))
            inside = inputs[r].copy()  # an output inside the input: still worked on a copy
            ring.reduce_scatter(t, inside, inside[r * M:(r + 1) * M], op, fp(n * M))
            found.append((apart, work[r * M:(r + 1) * M], inside[r * M:(r + 1) * M]))
        return found

    for rank, found in enumerate(run_threads(n, body)):
        for op, (apart, copied, inside) in zip(("SUM", "MAX"), found):
            assert apart.tobytes() == copied.tobytes() == inside.tobytes(), (rank, op)
            want = (np.sum if op == "SUM" else np.max)(np.stack(inputs), axis=0)
            np.testing.assert_allclose(apart, want[rank * M:(rank + 1) * M], rtol=1e-9,
                                       atol=1e-6)


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_tree_reduce_folds_in_scratch_and_leaves_every_other_rank_as_it_was(n, monkeypatch):
    # ranks with children below the root (vrank 2 at n >= 4, 4 at n >= 6) fold segment by
    # segment in the scratch; integers make every order exact
    monkeypatch.setattr(exchange, "SEGMENT_BYTES", PIECE_BYTES)
    rng = np.random.default_rng(n)
    inputs = [rng.integers(-1000, 1000, M).astype(np.float64) for _ in range(n)]

    def body(t):
        got = []
        for root in range(n):
            buf = inputs[t.rank].copy()
            tree.reduce(t, buf, root, ReduceOp.SUM, fp(M))
            got.append(buf)
        return got

    for rank, got in enumerate(run_threads(n, body)):
        for root, buf in enumerate(got):
            want = np.sum(inputs, axis=0) if rank == root else inputs[rank]
            assert buf.tobytes() == want.tobytes(), (rank, root)
