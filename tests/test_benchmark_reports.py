"""The benchmarks' report logic, without running any job: sizes, bus-bandwidth factors, the
plot's layout, the merging of repeated runs, goal verdicts and the marked sections of
RESULTS.md. The end-to-end runs are in ``test_benchmarks_smoke``."""
from __future__ import annotations

import os
import sys

import pytest

pytestmark = pytest.mark.timeout(60)
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import bench_collectives  # noqa: E402
import bench_common  # noqa: E402
import collectives_report  # noqa: E402
import distributed_training_benchmark as training  # noqa: E402
import fresh_calls  # noqa: E402
import timed_rows  # noqa: E402


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


def _row(backend: str, p: int, nbytes: int, seconds: float,
         collective: str = "all_reduce") -> dict:
    return dict(collective=collective, world_size=p, backend=backend, bytes=nbytes,
                seconds=seconds, algorithm="x", calls_per_batch=1, batches=1)


def test_plot_has_a_panel_per_collective_and_world_size(tmp_path):
    rows = [dict(_row(b, p, n, n / 1e9 + 1e-5), collective=c)
            for c in collectives_report.COLLECTIVES for p in (2, 4) for n in (4, 4096, 1 << 20)
            for b in ("shm", "MPI native")]
    for metric in ("busbw", "latency"):
        figure = tmp_path / f"{metric}.png"
        assert collectives_report.plot(rows, str(figure), metric) == [
            f"{c}, p = {p}" for p in (2, 4) for c in collectives_report.COLLECTIVES]
        assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with pytest.raises(ValueError, match="'speed'"):
        collectives_report.plot(rows, str(tmp_path / "x.png"), "speed")


def test_fresh_broadcast_rows_are_compared_with_mpi_rewriting_its_buffer_too():
    kib, us = 1 << 10, 1e-6
    rows = [_row("MPI native fresh data", 2, 64 * kib, 12 * us, "broadcast"),
            _row("shm fresh data", 2, 64 * kib, 8 * us, "broadcast"),
            _row("MPI native", 2, 64 * kib, 5 * us, "broadcast"),
            _row("shm", 2, 64 * kib, 10 * us, "broadcast"),
            _row("shm", 2, 4, 3 * us, "broadcast"), _row("MPI native", 2, 4, 2 * us, "broadcast"),
            _row("shm fresh data", 2, 4, 1 * us, "broadcast"),  # beside the latency goal's
            _row("MPI native fresh data", 2, 4, 9 * us, "broadcast")]
    cells = [[cell.strip() for cell in line.split("|")[1:-1]] for line in
             collectives_report.tables(rows).splitlines() if line.startswith("| 64 KiB")]
    # after the plain rows; each ratio is MPI's time over ours for the same kind of call
    assert [(c[1], c[3], c[-1]) for c in cells] == [
        ("shm", "10.0", "0.50x"), ("MPI native", "5.0", ""),
        ("shm fresh data", "8.0", "1.50x"), ("MPI native fresh data", "12.0", "")]
    text = collectives_report.report(rows, [], "python benchmarks/bench_collectives.py", "m")
    assert "Fresh data (broadcast, all_gather and reduce_scatter, on by default" in text
    goals = {goal: measured for goal, measured, _ in collectives_report.size_goals(rows)}
    assert goals["shm broadcast 4 B - 1 KiB <= MPI native + 1 us, p=2"] == \
        "worst 4 B: 3.00 vs 2.00 us (+1.00 us); 1 size, 4 B"  # the plain rows only
    assert bench_collectives.parse_args(["--backends", "shm"]).fresh is True
    for flag in ("--no-fresh", "--no-fresh-broadcast"):  # the broadcast-only name still works
        assert bench_collectives.parse_args(["--backends", "shm", flag]).fresh is False


def test_the_root_rewrites_its_buffer_before_each_call_and_readers_must_match_it():
    import numpy as np
    seen = []

    def make(collective, b):  # a stand-in for a broadcast: what the call is handed
        return lambda: seen.append(b["buf"].tolist())
    root_call = fresh_calls.rewriting_root(make, 0)("broadcast",
                                                         {"buf": np.zeros(3, np.float32)})
    reader_call = fresh_calls.rewriting_root(make, 1)("broadcast",
                                                           {"buf": np.zeros(3, np.float32)})
    root_call(), reader_call(), root_call()
    assert seen == [[1.0] * 3, [0.0] * 3, [2.0] * 3]  # readers write nothing
    fresh_calls.check_copies_of_root([(2.0, 2.0), (2.0, 2.0), (2.0, 2.0)], 12)
    with pytest.raises(RuntimeError, match=r"12 B.* rank 2 held 1.0 - 2.0, the root's 2.0"):
        fresh_calls.check_copies_of_root([(2.0, 2.0), (2.0, 2.0), (1.0, 2.0)], 12)
    with pytest.raises(RuntimeError, match="root's buffer held 0.0 - 0.0"):
        fresh_calls.check_copies_of_root([(0.0, 0.0), (0.0, 0.0)], 12)


def test_every_rank_rewrites_its_input_before_each_call_and_outputs_must_follow():
    import numpy as np
    p, n, seen = 3, 2, []

    def make(collective, b):  # a stand-in for an all-gather: what the call is handed
        return lambda: seen.append(b["send"].tolist())
    calls = [fresh_calls.rewriting(make, rank, p)("all_gather", {"send": np.zeros(n, np.float32)})
             for rank in range(p)]
    for call in calls + calls:
        call()
    assert seen == [[v] * n for v in (3, 4, 5, 6, 7, 8)]  # call index x p + rank
    with pytest.raises(ValueError, match="'all_reduce'"):
        fresh_calls.rewriting(make, 0, p)("all_reduce", {"buf": np.zeros(n, np.float32)})
    for size in (2, 3, 4, 8):  # the largest reduce-scatter sum is exact in float32
        assert size * size * (fresh_calls.index_period(size) + 1) <= 1 << 24
    with pytest.raises(ValueError, match="p = 5000"):
        fresh_calls.index_period(5000)
    inputs = [(6.0, 6.0), (7.0, 7.0), (8.0, 8.0)]  # call 2 on each rank
    gathered = np.repeat(np.float32([6, 7, 8]), n)
    fresh_calls.check_fresh_result("all_gather", inputs, gathered, 1, p)
    fresh_calls.check_fresh_result("reduce_scatter", inputs, np.full(n, 21, np.float32), 1, p)
    with pytest.raises(RuntimeError, match=r"^all_gather of 24 B .*: rank 1 of 3 held 6.0 at "
                                           r"element 2 \(2 of 6 wrong\), expected 7.0$"):
        fresh_calls.check_fresh_result("all_gather", inputs, np.repeat(np.float32([6, 6, 8]), n),
                                       1, p)
    with pytest.raises(RuntimeError, match=r"^reduce_scatter of 24 B .* held -1.0 at element 0"):
        fresh_calls.check_fresh_result("reduce_scatter", inputs, np.full(n, -1, np.float32), 0, p)
    with pytest.raises(RuntimeError, match=r"written by calls \[1, 2\]"):
        fresh_calls.check_fresh_result("all_gather", [(3.0, 3.0)] + inputs[1:], gathered, 0, p)
    with pytest.raises(RuntimeError, match=r"rank 2's input held 7.0 - 8.0"):
        fresh_calls.check_fresh_result("all_gather", inputs[:2] + [(7.0, 8.0)], gathered, 0, p)


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
    verdicts = {goal: ok for goal, _, ok in bench_collectives.earlier_goals(rows)}
    assert verdicts == {
        "shm all_reduce busbw >= 2x MPI native at 16 MiB, p=2": True,
        "shm all_reduce busbw >= 2x MPI native at 64 MiB, p=2": False,
        "shm all_reduce busbw >= 1x MPI native at 16 MiB, p=4": False,
        "shm all_reduce busbw >= 1x MPI native at 64 MiB, p=4": None,
        "shm 4-byte all_reduce <= 8 us, p=2": True,
        "tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2": False}
    assert bench_collectives.bandwidths(rows[5]) == pytest.approx((16 * mib / 0.011 / 1e9,
                                                                   1.5 * 16 * mib / 0.011 / 1e9))


def _size_goal_rows() -> list:
    """p = 2 measured in full, p = 4 in part: times in us, one figure per row."""
    kib, mib, us = 1 << 10, 1 << 20, 1e-6
    rows = []
    for nbytes, shm, native in ((4, 2.9, 2.0), (64, 3.1, 2.0), (kib, 3.0, 2.5)):
        rows += [_row("shm", 2, nbytes, shm * us), _row("MPI native", 2, nbytes, native * us)]
    rows += [_row("shm", 2, 4, 3.0 * us, "broadcast"),  # +1.2 us at 4 B: a miss
             _row("MPI native", 2, 4, 1.8 * us, "broadcast"),
             _row("shm", 2, 2 * kib, 9.0 * us, "broadcast"),  # past 1 KiB: not a latency size
             _row("MPI native", 2, 2 * kib, 1.0 * us, "broadcast"),
             _row("shm", 2, 0, 1.9 * us, "barrier"), _row("MPI native", 2, 0, 1.0 * us, "barrier"),
             _row("shm", 4, 16, 14.0 * us), _row("MPI native", 4, 16, 10.0 * us),  # 1.4x
             _row("shm", 4, 4, 15.0 * us), _row("mpi", 4, 4, 1.0 * us),  # no MPI native at 4 B
             _row("shm", 4, 0, 16.0 * us, "barrier"), _row("MPI native", 4, 0, 10.0 * us,
                                                           "barrier")]  # 1.6x
    # busbw = bytes / time at p = 2: ours 4.1 GB/s at 4 KiB, 0.95x MPI's at 1 MiB
    rows += [_row("shm", 2, 4 * kib, 4 * kib / 4.1e9), _row("MPI native", 2, 4 * kib, 1e-6),
             _row("shm", 2, mib, 0.001 / 0.95), _row("MPI native", 2, mib, 0.001),
             _row("shm", 2, 16 * mib, 0.004), _row("MPI native", 2, 16 * mib, 0.002)]  # past 4 MiB
    # AVERAGE and the plain loop against the batched SUM rows above (p = 2 only)
    rows += [_row("shm AVERAGE", 2, 4, 3.0 * us), _row("shm AVERAGE", 2, mib, 0.00116),
             _row("shm plain loop", 2, 4, 2.0 * us), _row("shm plain loop", 2, mib, 0.00108)]
    return rows


def test_size_goals_name_the_worst_size_and_follow_the_numbers():
    goals = collectives_report.size_goals(_size_goal_rows())
    shown = {goal: (measured, ok) for goal, measured, ok in goals}
    assert list(shown) == [  # every line whether measured or not, p = 2 before p = 4
        "shm all_reduce 4 B - 1 KiB <= MPI native + 1 us, p=2",
        "shm broadcast 4 B - 1 KiB <= MPI native + 1 us, p=2",
        "shm barrier <= MPI native + 1 us, p=2",
        "shm all_reduce 4 B - 1 KiB <= 1.5x MPI native, p=4",
        "shm broadcast 4 B - 1 KiB <= 1.5x MPI native, p=4",
        "shm barrier <= 1.5x MPI native, p=4",
        "shm all_reduce busbw >= 1x MPI native at 4 KiB - 4 MiB, p=2",
        "shm all_reduce busbw >= 1x MPI native at 4 KiB - 4 MiB, p=4",
        "shm AVERAGE <= 1.05x SUM time at every size, p=2",
        "shm plain loop <= 1.05x batched SUM time at every size, p=2",
        "shm AVERAGE <= 1.05x SUM time at every size, p=4",
        "shm plain loop <= 1.05x batched SUM time at every size, p=4"]
    assert list(shown.values()) == [
        ("worst 64 B: 3.10 vs 2.00 us (+1.10 us); 3 sizes, 4 B - 1 KiB", False),
        ("worst 4 B: 3.00 vs 1.80 us (+1.20 us); 1 size, 4 B", False),
        ("1.90 vs 1.00 us (+0.90 us)", True),
        ("worst 16 B: 14.00 vs 10.00 us (1.40x); 1 size, 16 B", True),
        ("-", None),
        ("16.00 vs 10.00 us (1.60x)", False),
        ("worst 1 MiB: 0.996 vs 1.05 GB/s (0.95x); 2 sizes, 4 KiB - 1 MiB", False),
        ("-", None),
        ("worst 1 MiB: 1160 vs 1053 us (1.10x); 2 sizes, 4 B - 1 MiB", False),
        ("worst 1 MiB: 1080 vs 1053 us (1.03x); 2 sizes, 4 B - 1 MiB", True),
        ("-", None), ("-", None)]


def test_size_goals_pass_at_their_limits():
    us, kib, mib = 1e-6, 1 << 10, 1 << 20
    rows = [_row("shm", 2, 4, 3.0 * us), _row("MPI native", 2, 4, 2.0 * us),  # + exactly 1 us
            _row("shm", 4, kib, 15.0 * us, "broadcast"),
            _row("MPI native", 4, kib, 10.0 * us, "broadcast"),  # exactly 1.5x
            _row("shm", 4, 4 * mib, 0.001), _row("MPI native", 4, 4 * mib, 0.001),  # 1x
            _row("shm AVERAGE", 2, 4, 3.15 * us), _row("shm plain loop", 2, 4, 1.0 * us),
            _row("shm", 2, 0, 0.5 * us, "barrier"),  # faster than MPI's
            _row("MPI native", 2, 0, 1.0 * us, "barrier")]
    goals = collectives_report.size_goals(rows)
    verdicts = {goal: ok for goal, _, ok in goals}
    assert ("shm barrier <= MPI native + 1 us, p=2", "0.50 vs 1.00 us (-0.50 us)", True) in goals
    assert verdicts["shm all_reduce 4 B - 1 KiB <= MPI native + 1 us, p=2"] is True
    assert verdicts["shm broadcast 4 B - 1 KiB <= 1.5x MPI native, p=4"] is True
    assert verdicts["shm all_reduce busbw >= 1x MPI native at 4 KiB - 4 MiB, p=4"] is True
    assert verdicts["shm AVERAGE <= 1.05x SUM time at every size, p=2"] is True
    assert verdicts["shm plain loop <= 1.05x batched SUM time at every size, p=2"] is True


def test_report_puts_the_size_goals_first_and_shows_the_barrier():
    rows = _size_goal_rows()
    text = collectives_report.report(rows, [], "python benchmarks/bench_collectives.py", "m")
    first, earlier = text.index("### Goals at every size"), text.index("### Earlier goals")
    assert first < text.index("| shm barrier <= MPI native + 1 us, p=2 |") < earlier
    assert earlier < text.index("| shm 4-byte all_reduce <= 8 us, p=2 |")
    barrier = text.split("### barrier, p = 2")[1].split("###")[0]
    assert "| shm | x | 1.9 | 0.53x |" in barrier and "| MPI native | x | 1.0 |  |" in barrier
    assert bench_collectives.goals(rows) == (collectives_report.size_goals(rows)
                                             + collectives_report.earlier_goals(rows))
    summary = bench_collectives.summary(rows).splitlines()  # printed last by a run
    assert len(summary) == len(bench_collectives.goals(rows))
    assert summary[2] == "PASS" + " " * 16 + "shm barrier <= MPI native + 1 us, p=2: " \
                                             "1.90 vs 1.00 us (+0.90 us)"
    assert summary[4] == "n/a (not measured)  shm broadcast 4 B - 1 KiB <= 1.5x MPI native, p=4: -"


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


class _Row:
    """A stand-in for ``timed_rows.TimedRow`` that logs when each of its batches ran."""

    def __init__(self, name: str, log: list) -> None:
        self.name, self.log = name, log

    def batch(self, calls: int) -> list:
        self.log.append(self.name)
        return [float(len(self.log))] * calls  # the batch's place in the log, once per call


def test_rows_of_a_size_are_timed_in_turns_after_one_untimed_round():
    log: list = []
    rows = [_Row(name, log) for name in "abc"]
    times = timed_rows.in_turns(rows, calls=2, batches=4)
    rounds = [log[i:i + 3] for i in range(0, len(log), 3)]
    assert len(rounds) == 5 and all(sorted(r) == ["a", "b", "c"] for r in rounds), log
    assert len({tuple(r) for r in rounds}) > 1, log  # the order changes from round to round
    for name, got in zip("abc", times):  # each row's timed batches: rounds 1-4, not round 0
        places = [i + 1 for i, ran in enumerate(log) if ran == name][1:]
        assert got == [float(p) for p in places for _ in range(2)], (name, got, log)
    again: list = []  # every rank shuffles alike: the same order in a second run
    timed_rows.in_turns([_Row(name, again) for name in "abc"], calls=2, batches=4)
    assert again == log
