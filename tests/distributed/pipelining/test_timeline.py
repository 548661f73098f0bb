"""``timeline()``: every pass recorded, in the schedule's order, as a trace, a PNG and a bubble.

Times are only compared coarsely (GPipe's bubble with one micro-batch against eight); the
passes sleep a fixed time so the comparison does not hang on how fast the machine is.
"""
import importlib.util
import json

import numpy as np
import pytest

from dist_harness import run_ranks
from pipeline_cases import mse

PASS_S = 0.004


def _sleepy_model(world_size, v=1):
    """Per stage: Linear then a layer that sleeps ``PASS_S`` in forward and in backward."""
    from neural_arch.nn import Linear, Module, Sequential
    import time

    class Sleepy(Module):
        def forward(self, x):
            time.sleep(PASS_S)
            y = x * 1.0
            y.register_hook(lambda grad: time.sleep(PASS_S))
            return y

    rng = np.random.default_rng(0)
    layers = []
    for _ in range(world_size * v):
        layers += [Linear(6, 6, dtype=np.float64), Sleepy()]
    model = Sequential(*layers)
    for p in model.parameters():
        p.array[...] = rng.standard_normal(p.array.shape) * 0.3
    return model


def _run(rank, world_size, kind, m, v=1):
    from neural_arch.distributed.pipelining import (PipelineStage, Schedule1F1B, ScheduleGPipe,
                                                    ScheduleInterleaved1F1B, pipeline_split)
    n = world_size * v
    parts = pipeline_split(_sleepy_model(world_size, v), n)
    stages = [PipelineStage(parts[i], i, n) for i in range(rank, n, world_size)]
    schedule = {"gpipe": lambda: ScheduleGPipe(stages[0], m, mse),
                "1f1b": lambda: Schedule1F1B(stages[0], m, mse),
                "interleaved": lambda: ScheduleInterleaved1F1B(stages, m, mse)}[kind]()
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((8 * m, 6)), rng.standard_normal((8 * m, 6))
    for _ in range(2):  # the second step's timeline replaces the first's
        if rank == 0:
            schedule.step(x)
        elif rank == world_size - 1:
            schedule.step(target=y, losses=[])
        else:
            schedule.step()
    return schedule.timeline(), schedule.timeline(gather=False)


def _order(events, stage):
    return [f"{e.action}{e.microbatch}" + (f".{e.chunk}" if e.chunk else "")
            for e in sorted(events, key=lambda e: e.start) if e.stage == stage]


def test_1f1b_timeline_follows_megatrons_order():
    results = run_ranks(_run, 2, "shm", timeout=60, args=("1f1b", 4))
    (events, local0), (events1, local1) = results
    assert events == events1  # gathered on every stage
    assert _order(events, 0) == "F0 F1 B0 F2 B1 F3 B2 B3".split()
    assert _order(events, 1) == "F0 B0 F1 B1 F2 B2 F3 B3".split()
    assert {e.stage for e in local0} == {0} and {e.stage for e in local1} == {1}
    for e in events:
        assert e.end >= e.start


def test_interleaved_timeline_is_complete_and_exports(tmp_path):
    from neural_arch.distributed.pipelining import (bubble_fraction, plot_timeline,
                                                    write_chrome_trace)
    events, _ = run_ranks(_run, 2, "shm", timeout=60, args=("interleaved", 4, 2))[0]
    for stage in (0, 1):
        for chunk in (0, 1):
            for action in "FB":
                got = sorted(e.microbatch for e in events
                             if (e.stage, e.chunk, e.action) == (stage, chunk, action))
                assert got == [0, 1, 2, 3], (stage, chunk, action, got)
    trace = json.loads(open(write_chrome_trace(events, str(tmp_path / "t.json"))).read())
    boxes = [t for t in trace["traceEvents"] if t["ph"] == "X"]
    assert len(boxes) == len(events) == 32
    assert {t["pid"] for t in boxes} == {0, 1} and all(t["dur"] >= 0 for t in boxes)
    assert 0.0 <= bubble_fraction(events) < 1.0
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib is not installed: the PNG part is not checked")
    png = plot_timeline(events, str(tmp_path / "t.png"))
    with open(png, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_gpipe_bubble_shrinks_with_more_microbatches():
    from neural_arch.distributed.pipelining import bubble_fraction
    one = run_ranks(_run, 2, "shm", timeout=60, args=("gpipe", 1))[0][0]
    eight = run_ranks(_run, 2, "shm", timeout=60, args=("gpipe", 8))[0][0]
    assert len(one) == 4 and len(eight) == 32
    # equal passes: 1/2 idle with one micro-batch, about 1/9 with eight
    assert bubble_fraction(one) > 0.2
    assert bubble_fraction(eight) < bubble_fraction(one)


def test_bubble_of_a_hand_made_timeline():
    from neural_arch.distributed.pipelining import Event, bubble_fraction
    events = [Event(0, "F", 0, 0, 0.0, 1.0), Event(1, "F", 0, 0, 1.0, 2.0),
              Event(1, "B", 0, 0, 2.0, 3.0), Event(0, "B", 0, 0, 3.0, 4.0)]
    assert bubble_fraction(events) == pytest.approx(0.5)
