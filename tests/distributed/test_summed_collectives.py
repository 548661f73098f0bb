"""Small broadcasts, all-gathers and reduce-scatters as one all-reduce (``algorithms.summed``;
shared memory's reduce-scatter as its own all-reduce) through the public calls on four real
processes of every installed backend: the bits of every rank's data (negative zeros and NaN
payloads included) at the size limit and one element above it, ranks on the short entry and on
the general path in one call, and ranks that pass different roots all told so, the group
usable after."""
from __future__ import annotations

import numpy as np
import pytest

from dist_harness import installed_backends, run_ranks
from neural_arch import distributed as dist
from neural_arch.distributed.algorithms import summed

pytestmark = pytest.mark.timeout(120)

WS = 4


def _odd(count: int, salt: int) -> np.ndarray:
    """float32 values a float sum would change: a negative zero and a NaN with a payload."""
    out = np.random.default_rng(salt).standard_normal(count).astype(np.float32)
    out[0] = -0.0
    if count > 1:
        out.view(np.uint32)[1] = 0xFFC01234
    return out


def _job(rank: int, ws: int) -> dict:
    report = {"wrong": [], "mismatch": None}
    limit = summed.MAX_BYTES["broadcast"] // 4
    for count in (1, 7, limit, limit + 1):  # the summed form, and the tree above its limit
        for root in range(ws):
            x = _odd(count, 100 * rank + count)
            # rank 1 through the general path (asynchronous), the others the short entry
            if rank == 1:
                dist.broadcast(x, src=root, async_op=True).wait()
            else:
                dist.broadcast(x, src=root)
            if x.tobytes() != _odd(count, 100 * root + count).tobytes():
                report["wrong"].append(f"broadcast {count} from {root}")
    per_rank = summed.MAX_BYTES["all_gather"] // 4 // ws
    for count in (1, 5, per_rank, per_rank + 1):
        mine = _odd(count, 7 * rank + count)
        out = np.zeros(2 * ws * count, np.float32)
        target = out[::2] if rank == 2 else out[:ws * count]  # rank 2: staged, general path
        dist.all_gather_into_tensor(target, mine)
        want = b"".join(_odd(count, 7 * r + count).tobytes() for r in range(ws))
        if np.ascontiguousarray(target).tobytes() != want:
            report["wrong"].append(f"all_gather {count}")
    limit = summed.MAX_BYTES["reduce_scatter"] // 8
    for count in (ws, 3 * ws, limit, limit + ws):
        x = (np.arange(count) % 11 + rank).astype(np.float64)
        out = np.empty(count // ws)
        if rank == 3:  # the general path
            dist.reduce_scatter_tensor(out, x, async_op=True).wait()
        else:
            dist.reduce_scatter_tensor(out, x)
        whole = ws * (np.arange(count) % 11) + ws * (ws - 1) / 2
        if not np.array_equal(out, whole[rank * out.size:(rank + 1) * out.size]):
            report["wrong"].append(f"reduce_scatter {count}")
    buf = np.full(3, float(rank))
    try:
        dist.broadcast(buf, src=1 if rank == ws - 1 else 0)
    except dist.CollectiveMismatchError as exc:
        report["mismatch"] = (str(exc).split("] ", 1)[1], buf.tolist())
    again = np.full(2, float(rank))
    dist.broadcast(again, src=2)
    report["after"] = again.tolist()
    return report


@pytest.mark.parametrize("backend", installed_backends())
def test_small_collectives_keep_every_bit_and_name_different_roots(backend):
    reports = run_ranks(_job, WS, backend, timeout=90)
    texts = set()
    for rank, report in enumerate(reports):
        assert report["wrong"] == [], (rank, report)
        text, kept = report["mismatch"]
        assert kept == [float(rank)] * 3, (rank, report)  # nothing written on a mismatch
        assert report["after"] == [2.0, 2.0], (rank, report)
        texts.add(text)
    assert len(texts) == 1, texts
    text = texts.pop()
    assert f"rank {WS - 1} passed root 1" in text and "passed root 0" in text, text
