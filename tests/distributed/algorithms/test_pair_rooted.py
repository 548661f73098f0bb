"""Two-rank reduce, gather and scatter in one exchange with their root check
(``algorithms.pair``), on every transport: NumPy's results from either root at sizes 0, 1, odd
and at the form's limit, the tree just above it, the reduce's operand order (the root's first),
ranks that pass different roots named on both with the group usable after, and ranks on either
side of the limit failing with both calls named. Also the two-rank all-gather and
reduce-scatter (one exchange each) with the input a view inside the output."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks
from pair_form_checks import check_limit_mismatch_named, check_roots_named_and_group_usable
from neural_arch.distributed.transports.base import PAIR_ROOTED_MAX_BYTES

pytestmark = pytest.mark.timeout(90)
LIMIT = PAIR_ROOTED_MAX_BYTES
CASES = [(0, np.float32), (1, np.float64), (7, np.int32), (LIMIT // 4, np.float32),
         (LIMIT // 4 + 1, np.float32)]


def _values(rank: int, n: int, dtype) -> np.ndarray:
    return ((np.arange(n) * 3 + 100 * rank + 1) % 1000).astype(dtype)


def _job(rank: int, world: int) -> dict:
    from neural_arch import distributed as dist
    from neural_arch.distributed.algorithms import pair
    forms = {name: getattr(pair, name) for name in ("reduce", "gather", "scatter")}
    used = {name: [] for name in forms}

    def counting(name):
        def counted(*args):
            done = forms[name](*args)
            used[name].append(done)
            return done
        return counted
    for name in forms:
        setattr(pair, name, counting(name))
    report = {"wrong": [], "mismatch": [], "after": None, "in place": []}
    try:
        for n, dtype in CASES:
            for root in (0, 1):
                mine = _values(rank, n, dtype)
                both = [_values(r, n, dtype) for r in (0, 1)]
                x = mine.copy()
                dist.reduce(x, dst=root, op=dist.ReduceOp.MAX)
                want = np.maximum(*both) if rank == root else mine
                if x.tobytes() != want.tobytes():
                    report["wrong"].append(("reduce", n, root))
                gathered = [np.empty(n, dtype) for _ in range(2)] if rank == root else None
                dist.gather(mine, gathered, dst=root)
                if rank == root and any(g.tobytes() != b.tobytes()
                                        for g, b in zip(gathered, both)):
                    report["wrong"].append(("gather", n, root))
                got = np.full(n, -1, dtype)
                blocks = [_values(root, n, dtype) + k for k in (0, 1)]
                dist.scatter(got, blocks if rank == root else None, src=root)
                if got.tobytes() != blocks[rank].tobytes():
                    report["wrong"].append(("scatter", n, root))
        # MAX of signed zeros shows the operand order: the root's first, as the tree folds
        for root in (0, 1):
            zeros = np.array([-0.0, 0.0, -0.0] if rank == root else [0.0, -0.0, 0.0],
                             np.float32)
            theirs = np.array([0.0, -0.0, 0.0] if rank == root else [-0.0, 0.0, -0.0],
                              np.float32)
            want = np.maximum(zeros, theirs) if rank == root else zeros.copy()
            dist.reduce(zeros, dst=root, op=dist.ReduceOp.MAX)
            if zeros.tobytes() != want.tobytes():
                report["wrong"].append(("reduce order", root))
        report["used"] = {name: flags[:] for name, flags in used.items()}
        # the two-rank all-gather and reduce-scatter with an input inside the output
        for n in (1, 5, LIMIT // 4):
            out = np.full((2, n), -1.0)
            out[rank] = _values(rank, n, np.float64)
            dist.all_gather_into_tensor(out, out[rank])
            report["in place"].append(out.tobytes() == np.stack(
                [_values(r, n, np.float64) for r in (0, 1)]).tobytes())
            whole = np.concatenate([_values(rank, n, np.float64), _values(rank + 2, n,
                                                                          np.float64)])
            dist.reduce_scatter_tensor(whole[rank * n:(rank + 1) * n], whole)
            want = sum(np.concatenate([_values(r, n, np.float64), _values(r + 2, n, np.float64)])
                       for r in (0, 1))[rank * n:(rank + 1) * n]
            report["in place"].append(whole[rank * n:(rank + 1) * n].tobytes() == want.tobytes())
        for roots in ((0, 1), (1, 0)):  # both the root, then neither
            try:
                dist.reduce(np.ones(4, np.float32), dst=roots[rank])
                report["mismatch"].append("returned")
            except dist.CollectiveMismatchError as e:
                report["mismatch"].append(str(e))
        report["after"] = dist.all_reduce(np.ones(3)).tolist()
        try:  # one rank at the form's limit, the other an element above it (the tree)
            dist.reduce(np.zeros(LIMIT // 4 + rank, np.float32), dst=0)
            report["across"] = ("returned", "")
        except dist.DistributedError as e:
            report["across"] = (type(e).__name__, str(e))
    finally:
        for name, form in forms.items():
            setattr(pair, name, form)
    return report


@pytest.fixture(scope="module", params=installed_backends())
def reports(request):
    return request.param, run_ranks(_job, 2, request.param, timeout=60,
                                    init_kwargs={"timeout": 10})


def test_results_are_numpys_from_either_root(reports):
    _, per_rank = reports
    assert [r["wrong"] for r in per_rank] == [[], []]


def test_the_form_runs_up_to_its_limit_and_the_tree_above(reports):
    _, per_rank = reports
    # every case from both roots: four up to the limit in one exchange, the last above it
    for r in per_rank:
        for name in ("gather", "scatter"):
            assert r["used"][name] == [True] * 8 + [False] * 2, (name, r["used"][name])
        assert r["used"]["reduce"] == [True] * 8 + [False] * 2 + [True] * 2, r["used"]


def test_all_gather_and_reduce_scatter_with_the_input_inside_the_output(reports):
    _, per_rank = reports
    assert [r["in place"] for r in per_rank] == [[True] * 6] * 2


def test_different_roots_are_named_on_both_ranks_and_the_group_stays_usable(reports):
    check_roots_named_and_group_usable(reports[1])


def test_a_reduce_at_the_limit_against_one_an_element_above_fails_naming_both(reports):
    check_limit_mismatch_named(reports[1], LIMIT // 4)
