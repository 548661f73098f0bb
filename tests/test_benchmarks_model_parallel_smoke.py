"""The model-parallel benchmark runs end to end on tiny sizes and reports numbers that agree
with each other: each bubble row's formula and distance, each speedup and each verdict are
recomputed from the printed values; the pictures and the trace are written. None judges speed
or memory itself."""
from __future__ import annotations

import json
import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(240)


def test_model_parallel_benchmark_reports_consistent_numbers(tmp_path):
    output, pictures = tmp_path / "RESULTS.md", tmp_path / "pictures"
    # stage waits of 10 ms (40 by default): the bubble's timeline is the same, only shorter
    result = _run("bench_model_parallel.py", ["--quick", "--forward-ms", "10",
                                              "--output", str(output),
                                              "--pictures", str(pictures)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_model_parallel:start -->") == 1
    rows = re.findall(r"^\| (gpipe|1f1b|interleaved) \| (\d) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) "
                      r"\| ([0-9.]+) \| (PASS|MISS) \|$", text, re.MULTILINE)
    # --quick: p = 2, m = 1, 2, 4, every schedule (interleaved with m = 1 < p too)
    assert sorted((r[0], r[2]) for r in rows) == sorted(
        (s, m) for s in ("gpipe", "1f1b", "interleaved") for m in "124")
    for schedule, p, m, formula, measured, points, verdict in rows:
        p, m = int(p), int(m)
        if schedule != "interleaved":
            expected = (p - 1) / (m + p - 1)
        elif m >= p:  # v = 2 chunks per rank
            expected = (p - 1) / (2 * m + p - 1)
        else:  # each micro-batch crosses the p v virtual stages one after another
            expected = 1 - 2 * m / (m + 2 * p - 1)
        assert float(formula) == pytest.approx(expected, abs=0.0005)
        assert abs(abs(float(measured) - float(formula)) * 100 - float(points)) <= 0.11
        assert 0 <= float(measured) < 1
        assert (verdict == "PASS") == (float(points) <= 5.0 + 0.05)
    speed = re.findall(r"^\| (one process|tensor parallel, tp = 2|1F1B pipeline, pp = 2, m = 2) "
                       r"\| ([0-9]+) \| ([12]) \| ([0-9.]+) \| ([0-9.]+) \| ([^|]*)\| ([^|]*)\|$",
                       text, re.MULTILINE)
    runs = ["one process", "tensor parallel, tp = 2", "1F1B pipeline, pp = 2, m = 2"]
    assert [(s[0], s[1]) for s in speed] == [(r, b) for b in ("4", "2") for r in runs], text
    for first in (0, 3):  # each batch's speedups against one process at that batch
        dense_ms = float(speed[first][3])
        for _, _, _, ms, speedup, _, _ in speed[first:first + 3]:
            assert _ratio_shown(float(speedup), dense_ms, float(ms), 1, 0.005, 0.05)
    # goals judged at the first batch only, for the parallel runs
    judged = [(s[0], s[4], s[5].strip(), s[6].strip()) for s in speed if s[5].strip()]
    assert [j[0] for j in judged] == runs[1:], speed
    assert not any(s[6].strip() for s in speed[3:] + speed[:1])
    for _, speedup, goal, verdict in judged:
        assert verdict == ("PASS" if float(speedup) >= float(goal.split()[-1]) else "MISS")
    held = re.findall(r"^\| ([24]) \| ([0-3]) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| "
                      r"(\d) \| [0-9.]+ \| [0-9.]+ \| (PASS|MISS) \|$", text, re.MULTILINE)
    assert [(h[0], h[1]) for h in held] == [("2", "0"), ("2", "1"), ("4", "0"), ("4", "1"),
                                            ("4", "2"), ("4", "3")], text
    for p, stage, one, gpipe, one_f_one_b, bound, verdict in held:
        assert float(one) > 0 and float(gpipe) > 0
        assert int(bound) == int(p) - int(stage)
        assert (verdict == "PASS") == (float(one_f_one_b) <= int(p) + 0.05 + 0.005)
    misses = sum(r[6] == "MISS" for r in rows) + sum(h[6] == "MISS" for h in held) + sum(
        1 for line in text.splitlines() if re.match(r"^\| (tensor|1F1B).*\| MISS \|$", line))
    assert f"{misses} row(s) miss their goal." in text
    for name in ("gpipe", "1f1b", "interleaved"):
        assert (pictures / f"pipeline_{name}.png").stat().st_size > 0
    trace = json.loads((pictures / "pipeline_1f1b_trace.json").read_text())
    assert {e["cat"] for e in trace["traceEvents"] if e["ph"] == "X"} == {"forward",
                                                                           "backward"}
