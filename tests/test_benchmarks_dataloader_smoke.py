"""The DataLoader benchmark runs end to end at a tiny size (64 samples, one epoch) and reports
ratios that follow from its printed samples/s; none judges speed. Without torch it measures
ours alone and says the peer rows are skipped."""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(90)
_ROW = re.compile(r"^\| ([02]) \| (\d+) \| ([0-9.]+) \| (\d+|—) \| ([0-9.]+|—) \| "
                  r"([0-9.]+|—) \|$", re.MULTILINE)


def test_dataloader_benchmark_reports_consistent_ratios(tmp_path):
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    output = tmp_path / "RESULTS.md"
    result = _run("bench_dataloader.py", ["--quick", "--output", str(output)], timeout=80)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_dataloader:start -->") == 1
    assert "Command: `python benchmarks/bench_dataloader.py --quick --output" in text
    assert "was shared with other work" in text
    rows = {int(w): tuple(map(float, rest)) for w, *rest in _ROW.findall(text)}
    assert sorted(rows) == [0, 2], text
    ours0, _, theirs0, _, _ = rows[0]
    assert rows[0][1] == 1.0 and rows[0][3] == 1.0
    for ours, ours_vs_0, theirs, theirs_vs_0, ratio in rows.values():
        # samples/s print as integers (half 0.5), ratios to 0.01 (half 0.005)
        assert _ratio_shown(ours_vs_0, ours, ours0, 1, 0.005, 0.5)
        assert _ratio_shown(theirs_vs_0, theirs, theirs0, 1, 0.005, 0.5)
        assert _ratio_shown(ratio, ours, theirs, 1, 0.005, 0.5)


def test_dataloader_benchmark_without_torch_measures_ours_and_says_so(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('torch is blocked in this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocked.parent))
    output = tmp_path / "RESULTS.md"
    result = _run("bench_dataloader.py", ["--quick", "--samples", "32", "--output",
                                          str(output)], timeout=60)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "torch not installed: peer rows skipped" in result.stdout
    text = output.read_text()
    assert "torch not installed: peer rows skipped" in text
    rows = _ROW.findall(text)
    assert [r[0] for r in rows] == ["0", "2"], text
    assert all(r[3:] == ("—", "—", "—") for r in rows) and rows[0][2] == "1.00"
