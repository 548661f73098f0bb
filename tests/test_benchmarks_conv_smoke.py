"""The convolution benchmark runs end to end at a tiny size (batch 8, 16×16 images, two steps)
and reports numbers that agree with each other: each ratio and PASS/MISS follows from the
printed times, the goal line counts the verdicts, the phase table repeats the step times.
None judges speed. Without torch it measures ours alone and says the peer rows are skipped."""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(150)
_TITLE = r"(Conv2d 3→16 3×3|resnet8)"
_ROW = re.compile(rf"^\| {_TITLE} \| ([12]) \| ([0-9 /]+) \| (\d+) \| ([0-9.]+) \| "
                  r"([0-9.]+|—) \| ([0-9.]+|—) \| (PASS|MISS|n/a \(not measured\)) \|$",
                  re.MULTILINE)
_PHASES = re.compile(rf"^\| {_TITLE} \| ([12]) \| ([0-9 /]+) \| (neural_arch|torch) \| "
                     r"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|$", re.MULTILINE)


def _rows(text: str) -> list:
    return [(title, int(p), threads, int(batch), float(ours), theirs, ratio, verdict)
            for title, p, threads, batch, ours, theirs, ratio, verdict in _ROW.findall(text)]


def _check_phases(text: str, rows: list, frameworks: tuple) -> None:
    steps = {(t, int(p), threads, name): float(step)
             for t, p, threads, name, _, _, _, step in _PHASES.findall(text)}
    for title, p, threads, _, ours, theirs, _, _ in rows:
        assert steps[(title, p, threads, "neural_arch")] == ours
        if "torch" in frameworks:
            assert steps[(title, p, threads, "torch")] == float(theirs)
    assert len(steps) == len(rows) * len(frameworks), text


@pytest.mark.slow
def test_conv_benchmark_reports_consistent_numbers(tmp_path):
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    output = tmp_path / "RESULTS.md"
    result = _run("bench_conv.py", ["--quick", "--output", str(output)], timeout=140)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_conv:start -->") == 1
    assert "Command: `python benchmarks/bench_conv.py --quick --output" in text
    assert "was shared with other work" in text
    rows = _rows(text)
    # one thread, default threads, then DDP on two ranks with half the batch each
    assert [(r[0], r[1], r[3]) for r in rows] == [
        ("Conv2d 3→16 3×3", 1, 8), ("resnet8", 1, 8), ("Conv2d 3→16 3×3", 1, 8),
        ("resnet8", 1, 8), ("resnet8", 2, 4)], text
    assert [r[2] for r in rows][:2] == ["1", "1"] and rows[4][2] == "1"
    for _, _, _, _, ours, theirs, ratio, verdict in rows:
        assert _ratio_shown(float(ratio), ours, float(theirs), 1, 0.005, 0.005)
        assert verdict == ("PASS" if float(ratio) <= 1.5 else "MISS")
    passed = sum(r[7] == "PASS" for r in rows)
    assert f"Goal neural_arch ≤ 1.5× torch: {passed} of 5 rows PASS." in text
    _check_phases(text, rows, ("neural_arch", "torch"))


def test_conv_benchmark_without_torch_measures_ours_and_says_so(tmp_path, monkeypatch):
    blocked = tmp_path / "blocked" / "torch"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('torch is blocked in this test')\n")
    monkeypatch.setenv("PYTHONPATH", str(blocked.parent))
    output = tmp_path / "RESULTS.md"
    result = _run("bench_conv.py", ["--quick", "--steps", "1", "--output", str(output)],
                  timeout=100)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "torch not installed: peer rows skipped" in result.stdout
    text = output.read_text()
    assert "torch not installed: peer rows skipped" in text
    rows = _rows(text)
    assert [(r[0], r[1]) for r in rows] == [("Conv2d 3→16 3×3", 1), ("resnet8", 1)] * 2, text
    assert all(r[5:] == ("—", "—", "n/a (not measured)") for r in rows)
    assert "Goal neural_arch ≤ 1.5× torch: n/a (not measured)." in text
    _check_phases(text, rows, ("neural_arch",))
