"""CommunicationProfiler: statistics, the trace timeline, and process-wide collective tracing."""
from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from dist_harness import run_ranks

pytestmark = pytest.mark.timeout(120)


def profiler(**kwargs):
    from neural_arch.distributed.advanced import CommunicationProfiler
    return CommunicationProfiler(**kwargs)


def test_statistics_of_timed_sleeps():
    prof = profiler()
    sleeps = [0.01, 0.02, 0.015]
    for s in sleeps:
        with prof.profile_operation("exchange", bytes_transferred=1000):
            time.sleep(s)
    stats = prof.get_statistics()["exchange"]
    assert stats["count"] == 3 and stats["total_bytes"] == 3000
    assert stats["min_time_ms"] >= 10.0 and stats["max_time_ms"] >= 20.0
    assert stats["total_time_ms"] >= 45.0
    assert stats["min_time_ms"] <= stats["avg_time_ms"] <= stats["max_time_ms"]
    assert stats["avg_time_ms"] == pytest.approx(stats["total_time_ms"] / 3)
    assert stats["bandwidth_mbps"] == pytest.approx(3000 / 1e6 / (stats["total_time_ms"] / 1e3))


def test_record_gives_exact_statistics():
    prof = profiler(rank=0)
    for seconds, nbytes in [(0.5, 4_000_000), (0.25, 1_000_000), (0.25, 0)]:
        prof.record("all_reduce", seconds, nbytes)
    prof.record("barrier", 0.0)
    stats = prof.get_statistics()
    assert stats["all_reduce"] == {"count": 3, "total_time_ms": 1000.0, "avg_time_ms": 1000 / 3,
                                   "min_time_ms": 250.0, "max_time_ms": 500.0,
                                   "total_bytes": 5_000_000, "bandwidth_mbps": 5.0}
    assert stats["barrier"]["count"] == 1 and stats["barrier"]["bandwidth_mbps"] == 0.0


def test_an_exception_inside_is_still_recorded_and_propagates():
    prof = profiler()
    with pytest.raises(KeyError):
        with prof.profile_operation("failing", 8):
            raise KeyError("boom")
    assert prof.get_statistics()["failing"]["count"] == 1


def test_disabled_profiler_records_nothing():
    prof = profiler(enabled=False)
    with prof.profile_operation("x", 10):
        pass
    prof.record("y", 1.0, 5)
    assert prof.get_statistics() == {} and prof.events() == []


@pytest.mark.parametrize("call,error,text", [
    (lambda p: p.record("", 1.0), TypeError, "non-empty str"),
    (lambda p: p.record("op", 1.0, -1), ValueError,
     "bytes_transferred of 'op' must be an int >= 0, got -1"),
    (lambda p: p.record("op", -0.5), ValueError, "seconds must be >= 0, got -0.5"),
    (lambda p: p.record("op", float("nan")), ValueError, "got nan"),
])
def test_bad_records_raise_with_their_values(call, error, text):
    with pytest.raises(error) as info:
        call(profiler())
    assert text in str(info.value)


def test_chrome_trace_json_schema(tmp_path):
    prof = profiler(rank=3)
    start = time.perf_counter()
    prof.record("first", 0.002, 64, start=start)
    prof.record("second", 0.001, 128, start=start + 0.010)
    worker = threading.Thread(target=lambda: prof.record("from_thread", 0.0005, 1))
    worker.start()
    worker.join()
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    events = json.loads(path.read_text())["traceEvents"]
    assert [e["name"] for e in events] == ["first", "second", "from_thread"]
    for e in events:
        assert set(e) == {"name", "ph", "ts", "dur", "pid", "tid", "args"}
        assert e["ph"] == "X" and e["pid"] == 3 and isinstance(e["tid"], int)
    assert [e["args"]["bytes"] for e in events] == [64, 128, 1]
    assert [e["dur"] for e in events] == pytest.approx([2000.0, 1000.0, 500.0])
    assert events[1]["ts"] - events[0]["ts"] == pytest.approx(10_000.0, abs=1e-3)
    assert events[2]["tid"] != events[0]["tid"]
    assert abs(events[0]["ts"] / 1e6 - time.time()) < 60, "timestamps are wall-clock microseconds"


def test_timeline_keeps_the_newest_events_and_reset_clears():
    prof = profiler(max_events=3)
    for i in range(5):
        prof.record(f"op{i}", 0.001)
    assert [e["name"] for e in prof.events()] == ["op2", "op3", "op4"]
    assert len(prof.get_statistics()) == 5, "statistics cover every call, not just the timeline"
    prof.reset()
    assert prof.get_statistics() == {} and prof.events() == []


def test_concurrent_records_are_all_counted():
    prof = profiler()

    def hammer():
        for _ in range(500):
            prof.record("op", 1e-6, 2)
    threads = [threading.Thread(target=hammer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = prof.get_statistics()["op"]
    assert stats["count"] == 2000 and stats["total_bytes"] == 4000


def test_collective_tracer_switch_and_hooks():
    from neural_arch.distributed import profiler as module
    from neural_arch.distributed.transports.base import Fingerprint
    outer, inner = profiler(), profiler()
    assert module.current_tracer() is None
    module.notify_collective("all_reduce", 8, 1.0, 1.5)  # no tracer: nothing to record

    def work():
        return "result"
    fp = Fingerprint("all_reduce:sum", 1, "float32", 10)
    assert module.trace_collective(work, "all_reduce", fp) is work, "no tracer: no wrapper"
    with module.trace_collectives(outer):
        module.notify_collective("all_reduce", 40, 2.0, 2.25)
        with module.trace_collectives(inner):
            assert module.current_tracer() is inner
            assert module.trace_collective(work, "broadcast", fp)() == "result"
        assert module.current_tracer() is outer
        module.trace_collective(work, "barrier", None)()
    assert module.current_tracer() is None
    assert set(outer.get_statistics()) == {"all_reduce", "barrier"}
    assert outer.get_statistics()["all_reduce"]["total_time_ms"] == 250.0
    assert outer.get_statistics()["all_reduce"]["total_bytes"] == 40
    assert outer.get_statistics()["barrier"]["total_bytes"] == 0
    assert inner.get_statistics()["broadcast"]["total_bytes"] == 40  # 10 float32
    assert module.set_collective_tracer(outer) is None
    assert module.set_collective_tracer(None) is outer
    with pytest.raises(TypeError, match="CommunicationProfiler or None, got dict"):
        module.set_collective_tracer({})


# ----------------------------------------------------------------------- with real processes
def ddp_steps_worker(rank: int, world_size: int, steps: int):
    """The seed's profiling block around AdvancedDistributedDataParallel training steps."""
    import neural_arch.functional as F
    from neural_arch.core import Tensor, manual_seed
    from neural_arch.distributed.advanced import (AdvancedDistributedDataParallel,
                                                  DistributedTrainingConfig)
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    manual_seed(rank)
    config = DistributedTrainingConfig(profile_communication=True, bucket_size_mb=0.0005)
    ddp_model = AdvancedDistributedDataParallel(MLP([10, 20, 5]), config)
    optimizer = SGD(ddp_model.parameters(), lr=0.1)
    rng = np.random.default_rng(rank)
    for _ in range(steps):
        loss = F.cross_entropy(ddp_model(Tensor(rng.standard_normal((4, 10)))),
                               Tensor(rng.integers(0, 5, 4)))
        ddp_model.backward_step(loss, optimizer)

    from neural_arch.distributed.advanced import CommunicationProfiler

    profiler = CommunicationProfiler()
    loss = F.cross_entropy(ddp_model(Tensor(rng.standard_normal((4, 10)))),
                           Tensor(rng.integers(0, 5, 4)))
    loss.backward()
    with profiler.profile_operation("gradient_sync", bytes_transferred=1024*1024):
        ddp_model.sync_gradients()

    stats = profiler.get_statistics()
    lines = []
    for operation, metrics in stats.items():
        lines.append(f"{operation}:")
        lines.append(f"  Average time: {metrics['avg_time_ms']:.2f} ms")
        lines.append(f"  Bandwidth: {metrics['bandwidth_mbps']:.2f} MB/s")
        lines.append(f"  Total operations: {metrics['count']}")
    grads = [p.grad.array.copy() for p in ddp_model.parameters()]
    return lines, stats, ddp_model.get_statistics(), grads, ddp_model.profiler.events()


def test_profiling_ddp_steps_and_the_seed_block():
    steps, param_bytes = 3, (10 * 20 + 20 + 20 * 5 + 5) * 4
    results = run_ranks(ddp_steps_worker, 2, "shm", args=(steps,))
    for rank, (lines, stats, model_stats, grads, events) in enumerate(results):
        assert lines[0] == "gradient_sync:" and lines[3] == "  Total operations: 1"
        assert stats["gradient_sync"]["total_bytes"] == 1024 * 1024
        comm = model_stats["communication"]
        # three backward_step syncs plus the seed block's explicit one
        assert comm["gradient_sync"]["count"] == steps + 1
        assert comm["gradient_sync"]["total_bytes"] == (steps + 1) * param_bytes
        assert comm["overflow_check"]["count"] == steps
        assert comm["overflow_check"]["total_bytes"] == steps * 4
        total = comm["gradient_sync"]["total_time_ms"] + comm["overflow_check"]["total_time_ms"]
        assert model_stats["communication_time_ms"]["total"] >= total
        assert [e["name"] for e in events] == ["gradient_sync", "overflow_check"] * steps + [
            "gradient_sync"]
        assert {e["pid"] for e in events} == {rank}
    for a, b in zip(results[0][3], results[1][3]):
        np.testing.assert_array_equal(a, b)  # the profiled sync really averaged the gradients


def tracing_worker(rank: int, world_size: int):
    """Every collective inside ``trace_collectives`` is recorded, with this rank's bytes."""
    from neural_arch import distributed as dist
    from neural_arch.distributed.advanced import CommunicationProfiler, trace_collectives
    prof = CommunicationProfiler()
    with trace_collectives(prof):
        dist.all_reduce(np.ones(100, dtype=np.float32))
        dist.all_reduce(np.ones(50, dtype=np.float64), async_op=True).wait()
        dist.broadcast(np.zeros(7, dtype=np.int64), src=0)
        dist.all_gather(np.ones(3, dtype=np.float16))
        dist.barrier()
    dist.all_reduce(np.ones(4))  # after the block: not recorded
    return prof.get_statistics()


def test_trace_collectives_records_every_collective():
    for stats in run_ranks(tracing_worker, 2, "shm"):
        counts = {name: s["count"] for name, s in stats.items()}
        assert counts == {"all_reduce": 2, "broadcast": 1, "all_gather": 1, "barrier": 1}
        assert stats["all_reduce"]["total_bytes"] == 100 * 4 + 50 * 8
        assert stats["broadcast"]["total_bytes"] == 7 * 8
        assert stats["all_gather"]["total_bytes"] == 3 * 2
        assert stats["barrier"]["total_bytes"] == 0
