"""The digits example trains to >= 95% test accuracy; the step benchmark runs and reports."""
import os
import re
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    env = dict(os.environ)
    # Small matrices: one BLAS thread avoids oversubscribing a shared machine.
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


@pytest.mark.timeout(300)
def test_train_digits_reaches_95_percent():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_digits.py"), "--seed", "0"],
        capture_output=True, text=True, timeout=280, env=_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    match = re.search(r"^final: test_accuracy=([0-9.]+) epochs=(\d+) seconds=([0-9.]+)$",
                      result.stdout, re.MULTILINE)
    assert match, result.stdout[-2000:]
    assert float(match.group(1)) >= 0.95
    assert "digits" in result.stderr  # the tqdm progress bar


@pytest.mark.timeout(120)
def test_the_self_launched_example_trains_in_two_processes_from_plain_python():
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "examples", "train_self_launched.py")],
        capture_output=True, text=True, timeout=110, env=_env(), cwd=ROOT)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "on 2 data-parallel rank(s)" in result.stdout  # two workers, started by the script
    match = re.search(r"^Final accuracy: ([0-9.]+)$", result.stdout, re.MULTILINE)
    assert match and result.stdout.count("Training time: ") == 1, result.stdout[-2000:]
    assert float(match.group(1)) >= 0.95


@pytest.mark.timeout(300)
def test_bench_step_writes_its_section(tmp_path):
    output = tmp_path / "RESULTS.md"
    output.write_text("# Results\n\nkept text\n", encoding="utf-8")
    command = [sys.executable, os.path.join(ROOT, "benchmarks", "bench_step.py"),
               "--steps", "2", "--warmup", "1", "--no-torch", "--output", str(output)]
    for _ in range(2):  # the second run replaces the section instead of appending another
        result = subprocess.run(command, capture_output=True, text=True, timeout=280,
                                env=_env(), cwd=ROOT)
        assert result.returncode == 0, result.stderr[-2000:]
    text = output.read_text(encoding="utf-8")
    assert text.startswith("# Results\n\nkept text\n")
    assert text.count("<!-- bench_step:start -->") == 1
    rows = re.findall(r"^\| (784-[0-9-]+) \| (\d+) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+) \|",
                      text, re.MULTILINE)
    assert {(m, b) for m, b, *_ in rows} == {("784-256-10", "64"), ("784-256-10", "512"),
                                             ("784-1024-1024-10", "64"),
                                             ("784-1024-1024-10", "512")}
    for _, _, ours, numpy_ms, ratio in rows:
        assert float(ratio) == pytest.approx(float(ours) / float(numpy_ms), abs=2e-3)
    assert "Command: `python benchmarks/bench_step.py --steps 2" in text
