"""The GPT-against-torch step benchmark runs on a tiny GPT, in one process and data parallel on
two (the first losses of the two models must agree, or it stops), and reports ratios and
verdicts that follow from its own numbers."""
from __future__ import annotations

import os
import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(240)


def test_gpt_step_benchmark_reports_consistent_numbers(tmp_path):
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    output = tmp_path / "RESULTS.md"
    result = _run("bench_gpt_step.py", ["--quick", "--steps", "2", "--warmup", "1",
                                        "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_gpt_step:start -->") == 1
    rows = re.findall(r"^\| 2 x 32, heads 2, T 16, B 4 \| ([12]) \| ([0-9.]+) \| ([0-9.]+) \| "
                      r"([0-9.]+) \| (PASS|MISS) \| (PASS|MISS) \|$", text, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2"], text  # one process, then DDP on two
    for _, ours, theirs, ratio, goal, floor in rows:
        assert _ratio_shown(float(ratio), float(ours), float(theirs), 1, 0.0005, 0.05)
        assert (goal == "PASS") == (float(ratio) <= 1.0 + 0.0005)
        assert (floor == "PASS") == (float(ratio) <= 1.15 + 0.0005)
    assert f"{sum(r[4] == 'MISS' for r in rows)} row(s) slower than torch." in text


def test_gpt_step_benchmark_times_an_earlier_commit_beside_the_current_one(tmp_path):
    """--baseline REF: the commit's own GPT step in a child process per rank, in the rotation;
    its first loss must equal the current one (same seeds), and its ratio follows its ms."""
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    import glob
    import tempfile
    extracted = os.path.join(tempfile.gettempdir(), "gpt-baseline-*")
    before = set(glob.glob(extracted))
    output = tmp_path / "RESULTS.md"
    result = _run("bench_gpt_step.py", ["--quick", "--steps", "2", "--warmup", "1",
                                        "--baseline", "HEAD", "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    commit = re.search(r"\| `([0-9a-f]{4,})` ms \| neural_arch / `\1` \|", text)
    assert commit, text
    rows = re.findall(r"^\| 2 x 32, heads 2, T 16, B 4 \| ([12]) \| ([0-9.]+) \| ([0-9.]+) \| "
                      r"([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \| (PASS|MISS) \| (PASS|MISS) \|$",
                      text, re.MULTILINE)
    assert [r[0] for r in rows] == ["1", "2"], text
    for _, ours, theirs, previous, vs_previous, vs_torch, _, _ in rows:
        assert _ratio_shown(float(vs_previous), float(ours), float(previous), 1, 0.0005, 0.05)
        assert _ratio_shown(float(vs_torch), float(ours), float(theirs), 1, 0.0005, 0.05)
    assert set(glob.glob(extracted)) == before  # the extracted commit is removed
