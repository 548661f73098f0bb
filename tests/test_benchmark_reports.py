"""The benchmarks' report logic, without running any job: sizes, bus-bandwidth factors, the
plot's layout, the merging of repeated runs, goal verdicts and the marked sections of
RESULTS.md. The end-to-end runs are in ``test_benchmarks_smoke``."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_collectives  # noqa: E402
import bench_common  # noqa: E402
import collectives_report  # noqa: E402
import distributed_training_benchmark as training  # noqa: E402


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
