"""The GPT training-run benchmark end to end on a tiny GPT (--quick: train_gpt at p = 2 under
our launcher, then torch's run of it), and its throughput accounting on made-up records.

The two runs start from the same weights and read the same windows in the same order with the
same schedule, so their whole loss curves agree to float rounding, not only the first loss: the
test compares every logged step, which catches a wrong schedule, data order or weight copy."""
from __future__ import annotations

import json
import math
import os
import re
import sys

import pytest

from repo_paths import REPO_ROOT
from test_benchmarks_smoke import _ratio_shown, _run

pytestmark = pytest.mark.timeout(240)
QUICK_STEPS, QUICK_TOKENS_PER_STEP = 30, 4 * 2 * 16  # batch 4 per rank, p = 2, block 16
_ROW = re.compile(r"^\| (neural_arch|torch [^|]+) \| (\d+) \| ([0-9.]+) \| ([0-9,]+) \| "
                  r"([0-9.]+) \| ([0-9,]+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) @ (\d+) \|$",
                  re.MULTILINE)


def _bench_module():
    sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
    import bench_gpt_run
    return bench_gpt_run


def _records(path) -> list:
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle]


def test_quick_run_reports_consistent_numbers_and_both_runs_learn_alike(tmp_path):
    pytest.importorskip("torch", reason="the benchmark measures against torch")
    output, chart, runs = tmp_path / "RESULTS.md", tmp_path / "loss.png", tmp_path / "runs"
    result = _run("bench_gpt_run.py", ["--quick", "--out-dir", str(runs), "--output",
                                       str(output), "--chart", str(chart)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_gpt_run:start -->") == 1
    rows = {m[0].split()[0]: m for m in _ROW.findall(text)}
    assert sorted(rows) == ["neural_arch", "torch"], text
    tps = {}
    for name, row in rows.items():
        steps, minutes, steady, ms, overall = (int(row[1]), float(row[2]),
                                               float(row[3].replace(",", "")), float(row[4]),
                                               float(row[5].replace(",", "")))
        assert steps == QUICK_STEPS and int(row[9]) == QUICK_STEPS
        # ms per step and tokens/s describe the same steady intervals
        assert _ratio_shown(ms, QUICK_TOKENS_PER_STEP, steady, 1e3, 0.05, 0.5, 0.0)
        # overall: every token of the run over its wall time (minutes printed to 0.01)
        assert _ratio_shown(overall, QUICK_STEPS * QUICK_TOKENS_PER_STEP, minutes * 60, 1,
                            0.5, 0.3, 0.0)
        tps[name] = (steady, overall)
    ratios = re.search(r"neural_arch / torch tokens/s: steady ([0-9.]+), overall ([0-9.]+)\.",
                       text)
    assert ratios, text
    for shown, ours, theirs in zip(map(float, ratios.groups()), tps["neural_arch"],
                                   tps["torch"]):
        assert _ratio_shown(shown, ours, theirs, 1, 0.0005, 0.5)
    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Loss curves:" in text and str(tmp_path) not in text.split("Machine:")[1]

    # the same start: step 1's loss is about ln(vocabulary) in both, and equal
    vocab = int(re.search(r"vocabulary (\d+)", text).group(1))
    ours, theirs = (_records(runs / name / "metrics.jsonl") for name in ("neural_arch", "torch"))
    first = [next(r for r in records if r["kind"] == "train") for records in (ours, theirs)]
    assert [r["step"] for r in first] == [1, 1]
    assert abs(first[0]["loss"] - math.log(vocab)) < 0.15, (first, vocab)
    assert abs(first[0]["loss"] - first[1]["loss"]) < 1e-3, first
    # ... and the same run: every logged loss and rate, and every validation, agree
    for kind, keys in (("train", ("loss", "lr")), ("val", ("val_loss",))):
        pairs = list(zip(*([r for r in records if r["kind"] == kind]
                           for records in (ours, theirs))))
        assert len(pairs) == (QUICK_STEPS if kind == "train" else 3)
        for a, b in pairs:
            assert a["step"] == b["step"]
            for key in keys:
                assert abs(a[key] - b[key]) <= 1e-3 * max(1.0, abs(a[key])), (key, a, b)
    assert os.path.exists(runs / "torch" / "checkpoint.pt")


def test_steady_throughput_leaves_out_intervals_holding_validation_or_an_epoch_end():
    bench = _bench_module()
    # 10 windows over 2 ranks = 5 per rank; batch 2: epochs of 3 steps, the last one short by 1
    tokens = bench.tokens_between(10, 2, 4)
    assert [tokens(0, 1), tokens(0, 3), tokens(2, 4), tokens(0, 6)] == \
        [2 * 2 * 4, 5 * 2 * 4, 3 * 2 * 4, 10 * 2 * 4]
    seconds = {2: 1.0, 4: 1.0, 6: 5.0, 8: 1.0, 10: 9.0}  # slow: after a validation or epoch end
    records = [{"kind": "train", "step": 2, "loss": 3.0, "tokens_per_second": 1.0}]
    for step in (4, 6, 8, 10):
        records.append({"kind": "train", "step": step, "loss": 2.0,
                        "tokens_per_second": tokens(step - 2, step) / seconds[step]})
    records += [{"kind": "val", "step": 4, "val_loss": 2.5},  # timed in (4, 6]
                {"kind": "epoch", "step": 9, "val_loss": 2.4}]  # timed in (8, 10]
    summary = bench.summarize(records, 10, 20.0, tokens)
    # kept: (2, 4] and (6, 8]; the first interval (start-up) is left out as well
    assert summary["steady_steps"] == 4
    assert summary["steady_tps"] == pytest.approx((tokens(2, 4) + tokens(6, 8)) / 2.0)
    assert summary["overall_tps"] == pytest.approx(tokens(0, 10) / 20.0)
    assert summary["final_val"] == (9, 2.4) and summary["first"] == (2, 3.0)
    with pytest.raises(RuntimeError, match="expected 12"):
        bench.summarize(records, 12, 20.0, tokens)
