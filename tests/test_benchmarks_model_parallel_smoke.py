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
    result = _run("bench_model_parallel.py", ["--quick", "--output", str(output),
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
                       r"\| ([12]) \| ([0-9.]+) \| ([0-9.]+) \|", text, re.MULTILINE)
    assert [s[0] for s in speed] == ["one process", "tensor parallel, tp = 2",
                                     "1F1B pipeline, pp = 2, m = 2"], text
    dense_ms = float(speed[0][2])
    for _, _, ms, speedup in speed:
        assert _ratio_shown(float(speedup), dense_ms, float(ms), 1, 0.005, 0.05)
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
