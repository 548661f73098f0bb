"""The ZeRO-overlap benchmark runs end to end on a tiny MLP (tcp only, where bytes are counted;
shm runs the same worker) and reports numbers that agree with each other: the formula column
from Ψ, every ratio from the printed values, bytes counted for every path. It judges no
speed."""
from __future__ import annotations

import re

import pytest

from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(60)
SIZES = [32, 64, 64, 64, 10]
PSI = sum(a * b + b for a, b in zip(SIZES[:-1], SIZES[1:]))
_NUM = r"([0-9.]+)"


def test_zero_overlap_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_zero_overlap.py",
                  ["--quick", "--backends", "tcp", "--output", str(output)], timeout=50)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_zero_overlap:start -->") == 1
    assert f"MLP 32-64-64-64-10 (Ψ = {PSI})" in text
    buckets = re.search(r"### p = 2, (\d+) DDP buckets", text)
    assert buckets and int(buckets.group(1)) >= 2, text  # small buckets: several of them
    rows = {name: (int(factor), *map(float, numbers)) for name, factor, *numbers in re.findall(
        rf"^\| (\w+) \| (\d)\(N-1\)/N \| {_NUM} \| {_NUM} \| {_NUM} \| – \| – \| "
        rf"{_NUM} \| {_NUM} \|$", text, re.M)}
    assert list(rows) == ["ddp", "ddp_hook", "zero", "overlap", "interleaved"], text
    assert [rows[n][0] for n in rows] == [2, 2, 3, 3, 3]
    ddp_tcp = rows["ddp"][4]
    for name, (factor, formula, sent, sent_x, tcp_ms, tcp_x) in rows.items():
        assert formula == pytest.approx(factor / 2 * 4 * PSI / 2 ** 20, abs=0.0005)
        assert sent > 0 and _ratio_shown(sent_x, sent, formula, 1, 0.0005, 0.0005)
        assert _ratio_shown(tcp_x, tcp_ms, ddp_tcp, 1, 0.005)
    # DDP sends its formula; ZeRO adds about the other rank's share (padding, uneven buckets)
    assert rows["ddp"][3] == pytest.approx(1.0, abs=0.01)
    assert rows["ddp_hook"][3] == pytest.approx(1.0, abs=0.01)  # allreduce_hook: DDP's bytes
    for name in ("zero", "overlap", "interleaved"):
        assert 0.95 <= rows[name][3] <= 1.4, text
