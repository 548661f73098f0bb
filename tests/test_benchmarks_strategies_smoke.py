"""The strategies benchmark runs end to end on a tiny MLP and reports numbers that agree with
each other: the ratio, the hidden share and the verdict are recomputed from the printed times,
the formula column from Ψ, the held column from its parts. None judges speed or memory itself.
"""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(60)
SIZES = [32, 64, 64, 64, 10]
PSI = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
# bytes per parameter of the whole model at N = 2 (tensor parallel: of this rank's share)
FORMULA = {"single": 16, "ddp": 16, "zero1": 12, "fsdp2": 10, "fsdp3": 8}
_NUM = r"(-?[0-9.]+)"


def test_strategies_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_strategies.py", ["--quick", "--output", str(output)], timeout=50)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_strategies:start -->") == 1
    assert "Command: `python benchmarks/bench_strategies.py --quick --output" in text
    assert f"MLP 32-64-64-64-10 (Ψ = {PSI})" in text

    steps = dict((path, tuple(map(float, numbers))) for path, *numbers in re.findall(
        rf"^\| (explicit|overlap) \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \|$", text, re.M))
    assert set(steps) == {"explicit", "overlap"}, text
    (explicit_ms, one, explicit_comm, _), (overlap_ms, ratio, overlap_comm, _) = \
        steps["explicit"], steps["overlap"]
    assert one == 1.0
    assert _ratio_shown(ratio, overlap_ms, explicit_ms, 1, 0.005)
    hidden = re.search(rf"Buckets: (\d+)\. Communication hidden: {_NUM} ms, {_NUM} of the "
                       rf"explicit step; overlap saved {_NUM} of it\.", text)
    assert hidden and int(hidden.group(1)) >= 2, text  # small buckets: several of them
    hidden_ms, share, saved = map(float, hidden.groups()[1:])
    assert hidden_ms == pytest.approx(explicit_comm - overlap_comm, abs=0.011)
    assert _ratio_shown(share, hidden_ms, explicit_ms, 1, 0.005)
    assert saved == pytest.approx(1 - ratio, abs=1e-9)
    goal = re.search(r"\(× explicit < 1 and ≤ 1 − ([0-9.-]+)/2\): (PASS|MISS)\.", text)
    assert goal and float(goal.group(1)) == share, text
    assert (goal.group(2) == "PASS") == (ratio < 1 and ratio <= 1 - share / 2 + 1e-9)

    rows = re.findall(rf"^\| (\w+) \| 2 \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \| "
                      rf"{_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \|$", text, re.M)
    assert [r[0] for r in rows] == list(FORMULA) + ["tensor_parallel"], text
    for name, formula, held, ratio_held, _, _, params, grads, optimizer, gathered in rows:
        if name in FORMULA:
            assert float(formula) == pytest.approx(FORMULA[name] * PSI / 2 ** 20, abs=0.005)
        parts = float(params) + float(grads) + float(optimizer) + float(gathered)
        assert float(held) == pytest.approx(parts, abs=0.021)  # four parts rounded to 0.01
        assert _ratio_shown(float(ratio_held), float(held), float(formula), 1, 0.005)
        assert float(grads) > 0  # counted while the optimizer steps, gradients still there
