"""The collective algorithms' errors on the in-process threaded transport: mismatched calls
named on both sides, a dead peer named by rank, a root's buffer of the wrong size refused before
anything is sent."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.distributed.algorithms import recursive_doubling, ring, tree
from neural_arch.distributed.errors import CollectiveMismatchError, PeerFailureError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports.base import Fingerprint
from threaded_transport import Fabric, run_threads

pytestmark = pytest.mark.timeout(120)


def fp(count: int, dtype=np.float64, op: str = "test") -> Fingerprint:
    return Fingerprint(op, 1, np.dtype(dtype).name, count)


def test_mismatched_collectives_name_both_sides():
    def body(t):
        buf = np.zeros(8)
        if t.rank == 0:
            ring.all_reduce(t, buf, ReduceOp.SUM, Fingerprint("all_reduce:sum", 3, "float64", 8))
        else:
            tree.broadcast(t, buf, 0, Fingerprint("broadcast:0", 3, "float64", 8))

    with pytest.raises(CollectiveMismatchError) as info:
        run_threads(2, body, timeout=20)
    assert "all_reduce:sum #3" in str(info.value) and "broadcast:0 #3" in str(info.value)


def test_mismatched_sizes_are_detected():
    def body(t):
        count = 10 if t.rank == 0 else 12
        recursive_doubling.all_reduce(t, np.ones(count), ReduceOp.SUM, fp(count))

    with pytest.raises(CollectiveMismatchError, match="10 x float64|12 x float64"):
        run_threads(2, body, timeout=20)


def test_dead_peer_is_reported_by_rank():
    fabric = Fabric(3, timeout=20)

    def body(t):
        if t.rank == 2:
            fabric.kill(2)
            return "gone"
        ring.all_reduce(t, np.ones(30), ReduceOp.SUM, fp(30))

    with pytest.raises(PeerFailureError, match="peer rank 2"):
        run_threads(3, body, fabric=fabric)


@pytest.mark.parametrize("root", [0, 1])
def test_gather_and_scatter_roots_name_a_whole_buffer_of_the_wrong_size(root):
    """The root's n x m buffer is checked before anything is sent; other ranks may pass None."""
    t = type("Rank", (), {"world_size": 3, "rank": root})()
    mine = np.zeros(2)
    for wrong in (None, np.zeros(5)):
        got = None if wrong is None else 5
        with pytest.raises(ValueError, match=rf"^gather root needs an output of 3 x 2 = 6 "
                                             rf"elements, got {got}$"):
            tree.gather(t, mine, wrong, root, fp(2, op="gather"))
        with pytest.raises(ValueError, match=rf"^scatter root needs an input of 3 x 2 = 6 "
                                             rf"elements, got {got}$"):
            tree.scatter(t, wrong, mine, root, fp(2, op="scatter"))
    with pytest.raises(ValueError, match="root rank 3 is out of range for world size 3"):
        tree.gather(t, mine, np.zeros(6), 3, fp(2, op="gather"))
