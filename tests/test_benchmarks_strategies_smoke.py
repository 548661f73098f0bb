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
        rf"^\| (explicit|overlap) \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \|$",
        text, re.M))
    assert set(steps) == {"explicit", "overlap"}, text
    (explicit_ms, one, explicit_comm, _, explicit_hidden), \
        (overlap_ms, ratio, overlap_comm, _, overlap_hidden) = steps["explicit"], steps["overlap"]
    assert one == 1.0
    assert explicit_hidden == 0.0 and overlap_hidden >= 0.0  # explicit hides nothing
    assert _ratio_shown(ratio, overlap_ms, explicit_ms, 1, 0.005)
    hidden = re.search(rf"Buckets: (\d+)\. Communication hidden: {_NUM} ms, {_NUM} of the "
                       rf"explicit step; overlap saved {_NUM} of it\.", text)
    assert hidden and int(hidden.group(1)) >= 2, text  # small buckets: several of them
    hidden_ms, share, saved = map(float, hidden.groups()[1:])
    assert hidden_ms == pytest.approx(explicit_comm - overlap_comm, abs=0.011)
    # negative where overlap waited longer than explicit (a busy machine)
    assert _ratio_shown(abs(share), abs(hidden_ms), explicit_ms, 1, 0.005)
    assert saved == pytest.approx(1 - ratio, abs=1e-9)
    goal = re.search(r"\(× explicit < 1 and ≤ 1 − ([0-9.-]+)/2\): (PASS|MISS)\.", text)
    assert goal and float(goal.group(1)) == share, text
    assert (goal.group(2) == "PASS") == (ratio < 1 and ratio <= 1 - share / 2 + 1e-9)

    # bytes per step: counted on tcp, beside 2 or 3 (N-1)/N of 4Ψ
    traffic = {name: (int(factor), *map(float, numbers)) for name, factor, *numbers in re.findall(
        rf"^\| (\w+) \| (\d)\(N-1\)/N \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \| {_NUM} \| "
        rf"{_NUM} \| {_NUM} \|$", text, re.M)}
    assert list(traffic) == ["ddp", "zero1", "zero1_over_ddp", "fsdp2", "fsdp3"], text
    assert [traffic[n][0] for n in traffic] == [2, 2, 3, 2, 3]
    for name, (factor, formula, sent, ratio_sent, shm_ms, shm_x, tcp_ms, tcp_x) in \
            traffic.items():
        assert formula == pytest.approx(factor / 2 * 4 * PSI / 2 ** 20, abs=0.005)
        assert sent > 0 and _ratio_shown(ratio_sent, sent, formula, 1, 0.0005)
        assert _ratio_shown(shm_x, shm_ms, traffic["ddp"][4], 1, 0.005)
        assert _ratio_shown(tcp_x, tcp_ms, traffic["ddp"][6], 1, 0.005)
    # ZeRO-1 by reduce-scatter moves DDP's bytes, a third less than over DDP's all-reduce
    assert traffic["zero1"][2] < 0.8 * traffic["zero1_over_ddp"][2]

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
