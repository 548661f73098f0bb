"""The TabGPT-against-torch step benchmark runs on a tiny TabGPT (the first losses of the two
models must agree, or it stops) and reports ratios and verdicts that follow from its own
numbers."""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(120)


@pytest.mark.slow
def test_tabgpt_step_benchmark_reports_consistent_numbers(tmp_path):
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    output = tmp_path / "RESULTS.md"
    result = _run("bench_tabgpt_step.py", ["--quick", "--steps", "2", "--warmup", "1",
                                           "--output", str(output)], timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_tabgpt_step:start -->") == 1
    rows = re.findall(r"^\| 3\+4 columns, d 16, 1 x 2 heads, B 16 \| (\w+) \| ([0-9.]+) \| "
                      r"([0-9.]+) \| ([0-9.]+) \| (PASS|MISS) \|$", text, re.MULTILINE)
    assert [r[0] for r in rows] == ["classification", "pretraining", "contrastive"], text
    for _, ours, theirs, ratio, goal in rows:
        assert _ratio_shown(float(ratio), float(ours), float(theirs), 1, 0.0005, 0.005)
        assert (goal == "PASS") == (float(ratio) <= 1.2 + 0.0005)
    misses = sum(r[4] == "MISS" for r in rows)
    assert f"goal: neural_arch <= 1.2x torch's step time; {misses} of 3 row(s) miss it." in text
