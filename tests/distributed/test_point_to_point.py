"""send/recv between processes: order, tags, and errors that name both sides."""
import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks


def _tagged_messages(rank, world_size):
    from neural_arch import distributed as dist
    from neural_arch.distributed.errors import CollectiveMismatchError
    peer = 1 - rank
    if rank == 0:
        for i in range(3):  # three messages in order, then one whose tag the receiver disputes
            dist.send(np.full(5 + i, float(i)), dst=peer, tag=7)
        dist.send(np.arange(4.0), dst=peer, tag=8)
        return None
    got = []
    for i in range(3):
        buf = np.empty(5 + i)
        dist.recv(buf, src=peer, tag=7)
        got.append(buf.tolist())
    try:
        dist.recv(np.empty(4), src=peer, tag=9)
    except CollectiveMismatchError as e:
        return got, str(e)
    return got, None


@pytest.mark.parametrize("backend", installed_backends())
def test_messages_arrive_in_order_and_a_tag_mismatch_names_both_tags(backend):
    _, (got, error) = run_ranks(_tagged_messages, 2, backend, timeout=120)
    assert got == [[float(i)] * (5 + i) for i in range(3)]
    assert error is not None and error.startswith("[rank 1, p2p:9 #4, peer rank 0]"), error
    assert "p2p:8" in error and "p2p:9" in error, error
