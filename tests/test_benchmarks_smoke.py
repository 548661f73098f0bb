"""The distributed benchmarks run end to end with tiny sizes and report consistent numbers.

Each script runs as a subprocess with real rank processes. The checks recompute every derived
column (bandwidths, ratios, efficiencies, PASS/MISS) from the printed times; none judges speed.
Every process a run starts inherits a unique marker variable, so leftovers can be found in /proc.
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

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_collectives  # noqa: E402
import bench_common  # noqa: E402
import collectives_report  # noqa: E402
import distributed_training_benchmark as training  # noqa: E402
from dist_harness import installed_backends  # noqa: E402

pytestmark = pytest.mark.timeout(240)
BACKENDS = installed_backends()
_MARKER = "NF_BENCH_SMOKE"
_ROW = re.compile(r"^\| (\d+ (?:B|KiB|MiB)) \| ([\w ]+?) \| (\w+) \| ([0-9.]+) \| ([0-9.e+-]+) \| "
                  r"([0-9.e+-]+) \| ([0-9.]+x)? \|$", re.MULTILINE)
_HEADING = re.compile(r"^#+ (all_reduce|all_gather|broadcast), p = (\d+)$", re.MULTILINE)
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


def test_size_parsing_and_formatting():
    assert [bench_common.parse_size(s) for s in ("4", "1K", "16MiB", "0.5M", "2G")] == \
        [4, 1024, 16 << 20, 512 << 10, 2 << 30]
    assert bench_common.parse_size_list("64K,4,64k") == [4, 65536]
    assert [bench_common.format_size(n) for n in (4, 1536, 4096, 256 << 20)] == \
        ["4 B", "1536 B", "4 KiB", "256 MiB"]
    for bad in ("", "12 parsecs", "-4", "0"):
        with pytest.raises(ValueError, match="size"):
            bench_common.parse_size(bad)


def test_bus_factors_and_message_shapes():
    assert [bench_collectives.bus_factor("all_reduce", p) for p in (2, 4)] == [1.0, 1.5]
    assert [bench_collectives.bus_factor("all_gather", p) for p in (2, 4)] == [0.5, 0.75]
    assert bench_collectives.bus_factor("broadcast", 4) == 1.0
    assert bench_collectives.element_count("all_reduce", 4, 4) == 1
    assert bench_collectives.element_count("all_gather", 4, 4) == 4  # one element per rank
    assert bench_collectives.element_count("all_gather", 100, 4) == 24
    # 4 B and 16 B are the same all-gather at p = 4 (one float32 per rank): timed once
    assert bench_collectives.message_counts("all_gather", [4, 16, 64], 4) == [4, 16]
    assert bench_collectives.message_counts("all_gather", [4, 16, 64], 2) == [2, 4, 16]
    for collective in collectives_report.COLLECTIVES:  # every one spans 4 B .. 256 MiB by 4x
        assert bench_collectives.DEFAULT_SIZES[collective] == [4 ** k for k in range(1, 15)]
    assert bench_collectives.schedule(4, 20) == (50, 20)
    assert bench_collectives.schedule(256 << 20, 20) == (1, 5)
    assert bench_collectives.schedule(256 << 20, 2) == (1, 2)


def _row(backend: str, p: int, nbytes: int, seconds: float) -> dict:
    return dict(collective="all_reduce", world_size=p, backend=backend, bytes=nbytes,
                seconds=seconds, algorithm="x", calls_per_batch=1, batches=1)


def test_plot_has_a_panel_per_collective_and_world_size(tmp_path):
    rows = [dict(_row(b, p, n, n / 1e9 + 1e-5), collective=c)
            for c in collectives_report.COLLECTIVES for p in (2, 4) for n in (4, 4096, 1 << 20)
            for b in ("shm", "MPI native")]
    figure = tmp_path / "bw.png"
    assert collectives_report.plot(rows, str(figure)) == [
        f"{c}, p = {p}" for p in (2, 4) for c in collectives_report.COLLECTIVES]
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_repeated_runs_report_the_median_of_each_point():
    rows = [_row("shm", 2, 4, t) for t in (3e-6, 9e-6, 5e-6)] + [_row("shm", 4, 4, 7e-6)] + \
        [_row("MPI native", 2, 4, t) for t in (2e-6, 1e-6)]
    merged = {(r["backend"], r["world_size"]): (r["seconds"], r["runs"])
              for r in bench_collectives.median_over_runs(rows)}
    assert merged == {("shm", 2): (5e-6, 3), ("shm", 4): (7e-6, 1),
                      ("MPI native", 2): (pytest.approx(1.5e-6), 2)}


def test_each_run_of_the_hardest_point_is_shown_in_run_order():
    mib = 1 << 20
    rows = bench_collectives.median_over_runs(
        [_row("shm", 2, 16 * mib, t) for t in (0.002, 0.008, 0.004)]
        + [_row("copy exchange", 2, 16 * mib, t) for t in (0.001, 0.008)]
        + [_row("shm", 2, 4 * mib, 0.001)])
    assert collectives_report.runs_line(rows) == (
        "All-reduce busbw of each run at 16 MiB, p = 2 (GB/s, in run order): "
        "shm 8.39, 2.1, 4.19; copy exchange 16.8, 2.1.")  # 16 MiB / seconds / 1e9
    assert collectives_report.runs_line(rows, nbytes=mib) == ""


def test_collective_goals_follow_the_numbers():
    mib = 1 << 20
    rows = [  # at p = 2 busbw = bytes / time; at p = 4 it is 1.5 bytes / time
        _row("MPI native", 2, 16 * mib, 0.010), _row("shm", 2, 16 * mib, 0.004),  # 2.5x
        _row("MPI native", 2, 64 * mib, 0.040), _row("shm", 2, 64 * mib, 0.030),  # 1.33x
        _row("MPI native", 4, 16 * mib, 0.010), _row("shm", 4, 16 * mib, 0.011),  # 0.91x
        _row("shm", 2, 4, 7.9e-6), _row("tcp", 2, 64 * mib, 64 * mib / 1.4e9)]    # 1.4 GB/s
    verdicts = {goal: ok for goal, _, ok in bench_collectives.goals(rows)}
    assert verdicts == {
        "shm all_reduce busbw >= 2x MPI native at 16 MiB, p=2": True,
        "shm all_reduce busbw >= 2x MPI native at 64 MiB, p=2": False,
        "shm all_reduce busbw >= 1x MPI native at 16 MiB, p=4": False,
        "shm all_reduce busbw >= 1x MPI native at 64 MiB, p=4": None,
        "shm 4-byte all_reduce <= 8 us, p=2": True,
        "tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2": False}
    assert bench_collectives.bandwidths(rows[5]) == pytest.approx((16 * mib / 0.011 / 1e9,
                                                                   1.5 * 16 * mib / 0.011 / 1e9))


def test_training_goal_follows_the_numbers():
    def row(backend, p, mode, step, batch=256):
        return dict(model="784-1024-1024-10", params=1_863_690, world_size=p, backend=backend,
                    mode=mode, batch=batch, steps=1, step=step, sync=0.0)
    rows = [row("-", 1, "manual", 0.030), row("shm", 2, "manual", 0.032),   # 93.75%
            row("shm", 2, "auto", 0.0345), row("tcp", 2, "manual", 0.031, batch=64)]
    verdicts = [(goal.split(", ")[-2:], shown, ok)
                for goal, shown, ok in training.goals(rows, ["shm", "tcp"])]
    assert verdicts == [(["shm", "manual sync"], "93.8%", True),
                        (["shm", "auto sync"], "87.0%", False),
                        (["tcp", "manual sync"], "-", None),  # another batch: not the goal
                        (["tcp", "auto sync"], "-", None)]


def test_write_section_replaces_only_its_own_section(tmp_path):
    path = tmp_path / "RESULTS.md"
    path.write_text("# Results\n\n<!-- other:start -->\nkeep me\n<!-- other:end -->\n")
    bench_common.write_section(str(path), "mine", "first")
    bench_common.write_section(str(path), "mine", "second")
    text = path.read_text()
    assert text == ("# Results\n\n<!-- other:start -->\nkeep me\n<!-- other:end -->\n\n"
                    "<!-- mine:start -->\nsecond\n<!-- mine:end -->\n")


def test_bench_collectives_reports_consistent_numbers(tmp_path):
    output, figure = tmp_path / "RESULTS.md", tmp_path / "bw.png"
    output.write_text("# Results\n\n<!-- bench_step:start -->\nstep table\n"
                      "<!-- bench_step:end -->\n\n<!-- bench_collectives:start -->\nstale\n"
                      "<!-- bench_collectives:end -->\n")
    result = _run("bench_collectives.py",
                  ["--backends", ",".join(BACKENDS), "--world-sizes", "2", "--sizes", "4,4K,1M",
                   "--iters", "2", "--repeats", "1", "--output", str(output), "--plot",
                   str(figure)])
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    text = output.read_text()
    assert text.startswith("# Results\n\n<!-- bench_step:start -->\nstep table\n"
                           "<!-- bench_step:end -->\n")
    assert text.count("<!-- bench_collectives:start -->") == 1 and "stale" not in text
    assert "Command: `python benchmarks/bench_collectives.py --backends" in text
    assert re.search(r"Machine: .+; \d+ cores; Python 3[.\d]+; NumPy [.\d]+; ", text)
    tables = _tables(text)
    expected_backends = set(BACKENDS) | ({"MPI native"} if "mpi" in BACKENDS else set())
    # p = 2: busbw/algbw is 2(p-1)/p = 1 for all_reduce, (p-1)/p = 1/2 for all_gather, 1 else;
    # all_gather of "4 B" still sends one float32 per rank.
    mib = 1 << 20
    expected = {"all_reduce": ((4, 4096, mib), 1.0), "all_gather": ((8, 4096, mib), 0.5),
                "broadcast": ((4, 4096, mib), 1.0)}
    # the shm jobs also time the buffer stream and the copy exchange, for all-reduces from 1 MiB
    references = ("buffer stream", "copy exchange")
    stream = {(mib, r) for r in references} if "shm" in BACKENDS else set()
    assert set(tables) == {(c, 2) for c in expected}
    for collective, (sizes, bus_over_alg) in expected.items():
        rows = tables[(collective, 2)]
        assert sorted((n, b) for n, b, *_ in rows) == sorted(
            {(n, b) for n in sizes for b in expected_backends}
            | (stream if collective == "all_reduce" else set()))
        native = {n: us for n, b, _, us, *_ in rows if b == "MPI native"}
        for nbytes, backend, _, us, algbw, busbw, ratio in rows:
            # times print to 0.1 us, bandwidths to 3 significant digits, ratios to 0.01
            assert _ratio_shown(algbw, nbytes / 1e3, us, 1, 0.0051 * algbw, 0.05, 0.0)
            assert busbw == pytest.approx(algbw * bus_over_alg, rel=0.011)
            if backend not in ("MPI native",) + references and native:  # MPI's over ours
                assert _ratio_shown(ratio, native[nbytes], us, 1, 0.005, 0.05)
            else:
                assert ratio is None
    tiny = re.search(r"\| shm 4-byte all_reduce <= 8 us, p=2 \| ([0-9.]+) us \| (PASS|MISS) \|",
                     text)
    assert tiny, text[:3000]
    assert (tiny.group(2) == "PASS") == (float(tiny.group(1)) <= 8.0)
    assert "| tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2 | - | n/a (not measured) |" in text
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_collectives_reports_a_job_past_its_time_limit(tmp_path):
    backends = ["shm"] + (["mpi"] if "mpi" in BACKENDS else [])
    result = _run("bench_collectives.py",
                  ["--backends", ",".join(backends), "--world-sizes", "2", "--sizes", "4",
                   "--collectives", "all_reduce", "--iters", "1000000", "--job-timeout", "4",
                   "--repeats", "1"])
    assert result.returncode == 1
    for backend in backends:
        assert f"Failed job: bench_collectives.py job on backend '{backend}' with 2 ranks ran " \
               f"past its time limit" in result.stdout


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
            "dist.all_reduce, short path", "dist.all_reduce, general path"]
        us = [float(t) for _, t, _ in rows]
        added = [float(a) for *_, a in rows]
        # each layer's addition is its time minus the row it builds on (0.01 us rounding)
        for got, want in zip(added, [us[0], us[1] - us[0], us[2] - us[1], us[3] - us[1]]):
            assert got == pytest.approx(want, abs=0.011)
    goal = re.search(r"\| shm 4-byte all_reduce <= 8 us, p=2 \| ([0-9.]+) us \| (PASS|MISS) \|",
                     text)
    assert goal, text[:3000]
    assert (goal.group(2) == "PASS") == (float(goal.group(1)) <= 8.0)
    short_path_p2 = re.search(r"### p = 2 .*?\| dist.all_reduce, short path \| ([0-9.]+) \|",
                              text, re.DOTALL)
    assert short_path_p2.group(1) == goal.group(1)
