"""A small two-rank broadcast in one exchange with its root check (``pair_broadcast`` of
``transports.base``), on the transports that run the portable broadcast (mpi) or their own pair
collectives (tcp): the root's bytes on both ranks at sizes 0, 1, odd and at the form's limit,
the two-step form just above it, ranks that pass different roots (both the root, neither)
named on both, the group still usable after, and ranks on either side of the limit failing
with the two calls named."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks
from pair_form_checks import check_limit_mismatch_named, check_roots_named_and_group_usable
from neural_arch.distributed.transports.base import PAIR_ROOTED_MAX_BYTES

pytestmark = pytest.mark.timeout(90)
BACKENDS = [b for b in installed_backends() if b in ("mpi", "tcp")]
LIMIT = PAIR_ROOTED_MAX_BYTES


def _job(rank: int, world: int) -> dict:
    from neural_arch import distributed as dist
    from neural_arch.distributed import algorithms
    from neural_arch.distributed.transports import base, tcp_pair
    used = []
    form = base.pair_broadcast

    def counted(*a):
        done = form(*a)
        used.append(done)
        return done
    algorithms.pair_broadcast = tcp_pair.pair_broadcast = counted
    report = {"wrong": [], "used": None, "mismatch": [], "after": None}
    cases = [(0, np.float32), (1, np.float64), (7, np.float64), (1001, np.float16),
             (LIMIT // 4, np.float32), (LIMIT // 4 + 1, np.float32)]
    try:
        for n, dtype in cases:
            for root in (0, 1):
                x = (np.arange(n) * 3 + 100 * rank + 1).astype(dtype)
                want = (np.arange(n) * 3 + 100 * root + 1).astype(dtype)
                dist.broadcast(x, src=root)
                if x.tobytes() != want.tobytes():
                    report["wrong"].append((n, np.dtype(dtype).name, root))
        report["used"] = used[:]
        for roots in ((0, 1), (1, 0)):  # both the root, then neither
            try:
                dist.broadcast(np.ones(4, np.float32), src=roots[rank])
                report["mismatch"].append("returned")
            except dist.CollectiveMismatchError as e:
                report["mismatch"].append(str(e))
        report["after"] = dist.all_reduce(np.ones(3)).tolist()
        try:  # one rank at the form's limit, the other an element above it (the two-step form)
            dist.broadcast(np.zeros(LIMIT // 4 + rank, np.float32), src=0)
            report["across"] = ("returned", "")
        except dist.DistributedError as e:
            report["across"] = (type(e).__name__, str(e))
    finally:
        algorithms.pair_broadcast = tcp_pair.pair_broadcast = form
    return report


@pytest.fixture(scope="module", params=BACKENDS)
def reports(request):
    return request.param, run_ranks(_job, 2, request.param, timeout=60,
                                    init_kwargs={"timeout": 10})


def test_both_ranks_end_with_the_roots_bytes(reports):
    _, per_rank = reports
    assert [r["wrong"] for r in per_rank] == [[], []]


def test_the_form_runs_up_to_its_limit_and_the_two_step_form_above(reports):
    _, per_rank = reports
    # every case from both roots: the five up to the limit in one exchange, the last above it
    for r in per_rank:
        assert r["used"] == [True] * 10 + [False] * 2, r["used"]


def test_different_roots_are_named_on_both_ranks_and_the_group_stays_usable(reports):
    check_roots_named_and_group_usable(reports[1])


def test_a_broadcast_at_the_limit_against_one_an_element_above_fails_naming_both(reports):
    check_limit_mismatch_named(reports[1], LIMIT // 4)
