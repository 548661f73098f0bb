"""The fp16-sync benchmark runs end to end on a tiny MLP (tcp, two ranks) and reports numbers
that agree with each other: every difference and ratio recomputed from the printed times. It
judges no speed."""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(60)
_MS = r"([0-9.]+)"


def test_fp16_sync_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_fp16_sync.py", ["--hidden", "32", "--steps", "4",
                                         "--output", str(output)], timeout=50)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_fp16_sync:start -->") == 1
    assert "MLP 64-32-32-10" in text, text[:2000]
    row = re.search(rf"^\| tcp \| 2 \| {_MS} \| {_MS} \| {_MS} \| {_MS} \| {_MS} \| "
                    rf"([+-][0-9.]+) \| (-?[0-9.]+) \| {_MS}x \| {_MS}x \|$", text, re.M)
    assert row, text[-3000:]
    none, fp16, hand, f16, f32, adds, casts, none_x, f32_x = map(float, row.groups())
    assert adds == pytest.approx(fp16 - hand, abs=0.011)
    assert casts == pytest.approx(hand - f16, abs=0.011)
    assert _ratio_shown(none_x, none, fp16, 1, 0.005)
    assert _ratio_shown(f32_x, f32, f16, 1, 0.005)
