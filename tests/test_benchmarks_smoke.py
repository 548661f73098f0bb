"""The distributed benchmarks run end to end with tiny sizes and report consistent numbers.

Each script runs as a subprocess with real rank processes. The checks recompute every derived
column (bandwidths, ratios, efficiencies, PASS/MISS) from the printed times; none judges speed.
Every process a run starts inherits a unique marker variable, so leftovers can be found in /proc.
The report logic alone (no jobs) is tested in ``test_benchmark_reports``; ``bench_collectives``
runs in ``test_benchmarks_collectives_smoke``.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import uuid
from typing import Optional

import pytest

from neural_arch.backends import numba_backend
from dist_harness import installed_backends

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.timeout(240)
BACKENDS = installed_backends()
_MARKER = "NF_BENCH_SMOKE"
_ROW = re.compile(r"^\| (\d+ (?:B|KiB|MiB)) \| ([\w ]+?) \| (\w+) \| ([0-9.]+) \| ([0-9.e+-]+) \| "
                  r"([0-9.e+-]+) \| ([0-9.]+x)? \|$", re.MULTILINE)
_HEADING = re.compile(r"^#+ (all_reduce|all_gather|reduce_scatter|broadcast|reduce|gather|"
                      r"scatter), p = (\d+)$", re.MULTILINE)
_SIZE = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20}


def _leftover_pids(tag: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as handle:
                    if f"{_MARKER}={tag}".encode() in handle.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _dead_segments() -> set[str]:
    """Our shm segments (nf_<pid>_...) whose creating process is gone: a leak."""
    names = set()
    for name in os.listdir("/dev/shm") if os.path.isdir("/dev/shm") else []:
        match = re.match(r"nf_(\d+)_", name)
        if match and not os.path.exists(f"/proc/{match.group(1)}"):
            names.add(name)
    return names


def _run(script: str, args: list[str], timeout: float = 200) -> subprocess.CompletedProcess:
    tag = uuid.uuid4().hex
    env = dict(os.environ, **{_MARKER: tag})
    leaked_before = _dead_segments()
    try:
        result = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", script),
                                 *args], capture_output=True, text=True, timeout=timeout,
                                env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        for pid in _leftover_pids(tag):  # the ranks this run started, found by their marker
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        raise
    assert _leftover_pids(tag) == [], "benchmark processes were left running"
    assert _dead_segments() - leaked_before == set(), "a shared-memory segment was left behind"
    return result


def _tables(text: str) -> dict:
    """{(collective, p): [(bytes, backend, algorithm, us, algbw, busbw, ratio or None)]}."""
    headings = list(_HEADING.finditer(text))
    tables = {}
    for i, heading in enumerate(headings):
        stop = headings[i + 1].start() if i + 1 < len(headings) else len(text)
        rows = []
        for size, backend, algorithm, us, algbw, busbw, ratio in \
                _ROW.findall(text[heading.end():stop]):
            number, unit = size.split()
            rows.append((int(number) * _SIZE[unit], backend, algorithm, float(us), float(algbw),
                         float(busbw), float(ratio[:-1]) if ratio else None))
        tables[(heading.group(1), int(heading.group(2)))] = rows
    return tables


def _ratio_shown(shown: float, num: float, den: float, scale: float, shown_half: float,
                 den_half: float = 0.005, num_half: Optional[float] = None) -> bool:
    """``shown`` is ``scale * num / den`` for some true values that print as ``num`` and
    ``den`` (rounded to ``num_half``/``den_half``), itself printed to within ``shown_half``."""
    num_half = den_half if num_half is None else num_half
    low = scale * max(num - num_half, 0.0) / (den + den_half)
    high = scale * (num + num_half) / max(den - den_half, 1e-9)
    return low - shown_half <= shown <= high + shown_half


def test_training_benchmark_reports_consistent_numbers(tmp_path):
    output, figure = tmp_path / "RESULTS.md", tmp_path / "scaling.png"
    backends = [b for b in BACKENDS if b != "tcp"]
    result = _run("distributed_training_benchmark.py",
                  ["--quick", "--backends", ",".join(backends), "--models", "784-64-10",
                   "--batch", "32", "--steps", "2", "--allreduce-sizes", "4K", "--iters", "2",
                   "--output", str(output), "--plot", str(figure)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- distributed_training_benchmark:start -->") == 1
    assert "Command: `python benchmarks/distributed_training_benchmark.py --quick" in text
    pattern = re.compile(r"^\| 784-64-10 \(51K\) \| ([\w-]+) \| (\d) \| 32 \| ([0-9.]+) \| "
                         r"([0-9.]+) \| ([0-9.]+)% \| ([0-9.]+)% \| (.+?) \| (.+?) \| (.+?) \| "
                         r"(.+?) \|$", re.MULTILINE)
    rows = {(m.group(1), int(m.group(2))): m.groups()[2:] for m in pattern.finditer(text)}
    assert set(rows) == {("-", 1)} | {(b, 2) for b in backends}, text[-3000:]
    single = float(rows[("-", 1)][0])
    for (backend, p), (step, sync, share, eff, auto_step, auto_share, auto_eff, gain) in \
            rows.items():
        step, sync = float(step), float(sync)
        assert _ratio_shown(float(share), sync, step, 100, 0.05)
        assert _ratio_shown(float(eff), single, step, 100, 0.05)
        if p == 1:
            assert (auto_step, auto_share, auto_eff, gain) == ("-", "-", "-", "-")
            continue
        assert _ratio_shown(float(gain.rstrip("x")), step, float(auto_step), 1, 0.005)
        assert _ratio_shown(float(auto_eff.rstrip("%")), single, float(auto_step), 100, 0.05)
    assert "#### all_reduce, p = 2" in text
    assert len(_tables(text)[("all_reduce", 2)]) == len(backends) + ("mpi" in backends)
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "batch 256 per rank, p=2, shm, manual sync | - | n/a (not measured) |" in text


def test_small_latency_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_small_latency.py", ["--world-sizes", "2,3", "--calls", "5",
                                             "--batches", "2", "--repeats", "2",
                                             "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_small_latency:start -->") == 1
    for p in (2, 3):
        block = text.split(f"### p = {p} (2 runs)")[1].split("###")[0]
        rows = re.findall(r"^\| ([^|]+?) \| ([0-9.]+) \| ([+-][0-9.]+) \|$", block, re.MULTILINE)
        assert [name for name, *_ in rows] == [
            "barrier on the arrival counters", "shm_direct all-reduce (algorithm only)",
            "dist.all_reduce, short path", "dist.all_reduce, general path",
            "shm_direct broadcast (algorithm only)", "dist.broadcast, short path",
            "dist.broadcast, general path", "shm_direct all-gather (algorithm only)",
            "dist.all_gather_into_tensor, short path",
            "dist.all_gather_into_tensor, general path", "dist.barrier"]
        us = [float(t) for _, t, _ in rows]
        added = [float(a) for *_, a in rows]
        # each layer's addition is its time minus the row it builds on (0.01 us rounding)
        for got, want in zip(added, [us[0], us[1] - us[0], us[2] - us[1], us[3] - us[1],
                                     us[4] - us[0], us[5] - us[4], us[6] - us[4],
                                     us[7] - us[0], us[8] - us[7], us[9] - us[7],
                                     us[10] - us[0]]):
            assert got == pytest.approx(want, abs=0.011)
    goal = re.search(r"\| shm 4-byte all_reduce <= 8 us, p=2 \| ([0-9.]+) us \| (PASS|MISS) \|",
                     text)
    assert goal, text[:3000]
    assert (goal.group(2) == "PASS") == (float(goal.group(1)) <= 8.0)
    short_path_p2 = re.search(r"### p = 2 .*?\| dist.all_reduce, short path \| ([0-9.]+) \|",
                              text, re.DOTALL)
    assert short_path_p2.group(1) == goal.group(1)


def test_shm_copies_benchmark_reports_every_job(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_shm_copies.py", ["--repeats", "2", "--calls", "2",
                                          "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_shm_copies:start -->") == 1
    rows = re.findall(r"^\| (\d) \| (\d+) \| (\d+|-) \| (\d+) \| (\d+) \| (yes)? \|$", text,
                      re.MULTILINE)
    assert [row[0] for row in rows] == ["1", "2"], text
    for _, into_peer, streamed, unread, _, spell in rows:
        assert (streamed == "-") == (not numba_backend.is_available())
        assert (spell == "yes") == (int(into_peer) > 5 * int(unread))
    spells = sum(row[5] == "yes" for row in rows)
    assert f"Jobs in a spell: {spells} of 2." in text


def test_activation_checkpointing_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_activation_checkpointing.py", ["--quick", "--steps", "1", "--warmup",
                                                         "0", "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_activation_checkpointing:start -->") == 1
    rows = dict((name, (float(peak), float(ms))) for name, peak, ms in re.findall(
        r"^\| GPT 2 x 32, T=16, B=2 \| (off|on) \| [0-9.]+ \| ([0-9.]+) \| ([0-9.]+) \|$", text,
        re.MULTILINE))
    assert set(rows) == {"off", "on"}, text
    goals = re.findall(r"^\| (?:peak activations|step time) on / off <= ([0-9.]+) \| ([0-9.]+) "
                       r"\| (PASS|MISS) \|$", text, re.MULTILINE)
    assert len(goals) == 2, text
    # ratios print to 0.001 from values printed to 0.01 MiB and 0.1 ms
    for (goal, shown, verdict), column, half in zip(goals, (0, 1), (0.005, 0.05)):
        assert _ratio_shown(float(shown), rows["on"][column], rows["off"][column], 1, 0.0005,
                            half)
        assert (verdict == "PASS") == (float(shown) <= float(goal))


def test_compression_benchmark_reports_consistent_numbers(tmp_path):
    output = tmp_path / "RESULTS.md"
    result = _run("bench_compression.py", ["--quick", "--backends", "shm", "--epochs", "1",
                                           "--hooks", "none,powersgd-4,topk-1%",
                                           "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.count("<!-- bench_compression:start -->") == 1
    rows = re.findall(r"^\| shm \| 2 \| ([\w%-]+) \| ([0-9.]+) KiB \| ([0-9.]+)% \| ([0-9.]+) \| "
                      r"([0-9.]+)% \| ([+-][0-9.]+) \|$", text, re.MULTILINE)
    assert [row[0] for row in rows] == ["none", "powersgd-4", "topk-1%"], text[-3000:]
    dense = float(rows[0][1])
    for hook, kib, share, _, accuracy, change in rows:
        # KiB print to 0.1, shares and accuracies to 0.01
        assert _ratio_shown(float(share), float(kib), dense, 100, 0.005, 0.05)
        assert float(change) == pytest.approx(float(accuracy) - float(rows[0][4]), abs=0.011)
    # top-k 1% sends 1% of the values and as many int32 indices
    assert float(rows[2][2]) == pytest.approx(2.0, abs=0.05)
    goal = re.search(r"\| PowerSGD rank 4, shm, p=2 \| ([0-9.]+)% of the bytes, accuracy "
                     r"([+-][0-9.]+) points \| (PASS|MISS) \|", text)
    assert goal, text[-3000:]
    ok = float(goal.group(1)) <= 5.0 and float(goal.group(2)) >= -1.0
    assert (goal.group(3) == "PASS") == ok


def test_compression_benchmark_help_and_fp16_goal_row(tmp_path):
    helped = _run("bench_compression.py", ["--help"])
    assert helped.returncode == 0 and "--hidden" in helped.stdout, helped.stderr[-2000:]
    output = tmp_path / "RESULTS.md"
    result = _run("bench_compression.py", ["--quick", "--backends", "shm", "--epochs", "1",
                                           "--hidden", "32", "--hooks", "none,fp16",
                                           "--output", str(output)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert "MLP 64-32-32-10" in text, text[:2000]
    times = dict(re.findall(r"^\| shm \| 2 \| (none|fp16) \| [0-9.]+ (?:KiB|B) \| [0-9.]+% \| "
                            r"([0-9.]+) \|", text, re.MULTILINE))
    goal = re.search(r"\| fp16 sync >= 1.0x faster than none, shm, p=2 \| ([0-9.]+)x \(([0-9.]+) "
                     r"vs ([0-9.]+) ms\) \| (PASS|MISS) \|", text)
    assert goal and set(times) == {"none", "fp16"}, text[-3000:]
    assert _ratio_shown(float(goal.group(1)), float(times["none"]), float(times["fp16"]), 1,
                        0.005, 0.0005)
    assert (goal.group(4) == "PASS") == (float(goal.group(1)) >= 1.0)
