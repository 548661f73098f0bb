"""What a collective on the general path asks per call besides its checks: on a group whose
transport has no short calls (``collectives.tensors``), it does not look for them again."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch import distributed as dist
from neural_arch.distributed.collectives import tensors
from neural_arch.distributed.profiler import CommunicationProfiler, trace_collectives

pytestmark = [pytest.mark.timeout(30), pytest.mark.usefixtures("one_rank_group")]


def test_a_group_without_short_calls_is_not_asked_for_them_on_every_call(monkeypatch):
    asked = []
    look_up = tensors._short_calls
    monkeypatch.setattr(tensors, "_short_calls", lambda: (asked.append(1), look_up())[1])
    x = np.arange(3, dtype=np.float32)
    for _ in range(3):
        assert dist.all_reduce(x) is x and dist.broadcast(x, 0) is x
        dist.barrier()
    np.testing.assert_array_equal(x, [0, 1, 2])
    assert asked == [], f"asked for short calls {len(asked)} times"
    profiler = CommunicationProfiler()
    with trace_collectives(profiler):  # the profiler hook still sees each call
        dist.all_reduce(x, dist.ReduceOp.AVG)
    assert profiler.get_statistics()["all_reduce"]["count"] == 1
    np.testing.assert_array_equal(x, [0, 1, 2])
