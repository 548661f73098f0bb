"""``bench_collectives.py`` runs end to end with tiny sizes and reports consistent numbers: every
bandwidth, ratio and goal line is recomputed from the printed times (none judges speed), a goal
nothing measured reads "not measured", and a job past its time limit is reported. The checks a
job makes of its reduce-scatters, reduces, gathers and scatters are tried on ranks as threads,
with right and wrong results."""
from __future__ import annotations

import os
import re
import sys
import threading
import types

import numpy as np
import pytest

from neural_arch.distributed.transports.base import PAIR_ROOTED_MAX_BYTES
from test_benchmarks_smoke import _SIZE, BACKENDS, _ratio_shown, _run, _tables

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                "benchmarks"))
import collective_calls  # noqa: E402

pytestmark = pytest.mark.timeout(240)
# the collectives timed only when named, each with MPI's own call in its algorithm column
_OPT_IN_NATIVE = {"reduce_scatter": "MPI_Reduce_scatter_block", "reduce": "MPI_Reduce",
                  "gather": "MPI_Gather", "scatter": "MPI_Scatter"}


@pytest.mark.slow
def test_bench_collectives_reports_consistent_numbers(tmp_path):
    output, figure = tmp_path / "RESULTS.md", tmp_path / "bw.png"
    output.write_text("# Results\n\n<!-- bench_step:start -->\nstep table\n"
                      "<!-- bench_step:end -->\n\n<!-- bench_collectives:start -->\nstale\n"
                      "<!-- bench_collectives:end -->\n")
    result = _run("bench_collectives.py",
                  ["--backends", ",".join(BACKENDS), "--world-sizes", "2", "--sizes", "4,4K,1M",
                   "--collectives", "all_reduce,all_gather,broadcast,barrier,reduce_scatter,"
                   "reduce,gather,scatter",
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
    # p = 2: busbw/algbw is 2(p-1)/p = 1 for all_reduce, (p-1)/p = 1/2 for all_gather,
    # reduce_scatter, gather and scatter, 1 else; all_gather and gather of "4 B" still send
    # one float32 per rank, and reduce_scatter and scatter of "4 B" still give each rank one.
    mib = 1 << 20
    expected = {"all_reduce": ((4, 4096, mib), 1.0), "all_gather": ((8, 4096, mib), 0.5),
                "reduce_scatter": ((8, 4096, mib), 0.5), "broadcast": ((4, 4096, mib), 1.0),
                "reduce": ((4, 4096, mib), 1.0), "gather": ((8, 4096, mib), 0.5),
                "scatter": ((8, 4096, mib), 0.5)}
    # the shm jobs also time the buffer stream and the copy exchange for all-reduces from
    # 1 MiB, and our all-reduce with AVERAGE and in a plain loop at every size
    references = ("buffer stream", "copy exchange")
    variants = ("shm AVERAGE", "shm plain loop")
    stream = ({(mib, r) for r in references} | {(n, v) for n in (4, 4096, mib) for v in variants}
              if "shm" in BACKENDS else set())
    # every broadcast, all-gather and reduce-scatter is timed again with its inputs rewritten
    # before each call, ours and MPI's alike, each compared with MPI's rewritten one
    fresh = {c: {(n, f"{b} fresh data") for n in expected[c][0] for b in expected_backends}
             for c in ("all_gather", "reduce_scatter", "broadcast")}
    extra = {"all_reduce": stream, **fresh}
    assert set(tables) == {(c, 2) for c in expected}
    for collective, (sizes, bus_over_alg) in expected.items():
        rows = tables[(collective, 2)]
        assert sorted((n, b) for n, b, *_ in rows) == sorted(
            {(n, b) for n in sizes for b in expected_backends} | extra.get(collective, set()))
        native = {(n, b): us for n, b, _, us, *_ in rows if b.startswith("MPI native")}
        if collective in _OPT_IN_NATIVE:
            assert {a for _, b, a, *_ in rows if b == "MPI native"} == \
                ({_OPT_IN_NATIVE[collective]} if "mpi" in BACKENDS else set())
        if collective in ("reduce", "gather", "scatter"):  # every rank's part: pair or tree
            part = {n: n if collective == "reduce" else n // 2 for n in sizes}
            assert sorted((n, b, a) for n, b, a, *_ in rows if b in BACKENDS) == sorted(
                (n, b, "pair" if part[n] <= PAIR_ROOTED_MAX_BYTES else "tree")
                for n in sizes for b in BACKENDS)
            # the sizes straddle the limit
            assert {a for _, b, a, *_ in rows if b in BACKENDS} == {"pair", "tree"}
        for nbytes, backend, _, us, algbw, busbw, ratio in rows:
            # times print to 0.1 us, bandwidths to 3 significant digits, ratios to 0.01
            assert _ratio_shown(algbw, nbytes / 1e3, us, 1, 0.0051 * algbw, 0.05, 0.0)
            assert busbw == pytest.approx(algbw * bus_over_alg, rel=0.011)
            # the ratio: the time of MPI's row of the same kind over ours
            peer = "MPI native fresh data" if backend.endswith(" fresh data") else "MPI native"
            if not backend.startswith("MPI native") and backend not in references and native:
                assert _ratio_shown(ratio, native[(nbytes, peer)], us, 1, 0.005, 0.05)
            else:
                assert ratio is None
    tiny = re.search(r"\| shm 4-byte all_reduce <= 8 us, p=2 \| ([0-9.]+) us \| (PASS|MISS) \|",
                     text)
    assert tiny, text[:3000]
    assert (tiny.group(2) == "PASS") == (float(tiny.group(1)) <= 8.0)
    assert "| tcp all_reduce busbw >= 1.5 GB/s at 64 MiB, p=2 | - | n/a (not measured) |" in text
    assert figure.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    barrier = _barrier_table(text)
    assert set(barrier) == expected_backends
    for backend, (us, ratio) in barrier.items():
        if backend != "MPI native" and "MPI native" in barrier:
            assert _ratio_shown(ratio, barrier["MPI native"][0], us, 1, 0.005, 0.05)
        else:
            assert ratio is None
    _check_size_goals(text, tables, barrier)
    # the run ends with every goal line of the report, verdict first
    summary = result.stdout.split("\nGoals:\n")[-1]
    lines = re.findall(r"^\| (.+?) \| (.+?) \| (PASS|MISS|n/a \(not measured\)) \|$", text,
                       re.MULTILINE)
    assert len(lines) == 18 and len(summary.splitlines()) == 18, summary
    for goal, measured, verdict in lines:
        assert re.search(rf"^{re.escape(verdict)} +{re.escape(goal)}: {re.escape(measured)}$",
                         summary, re.MULTILINE), (goal, summary)


_BARRIER_ROW = re.compile(r"^\| ([\w ]+?) \| (\w+) \| ([0-9.]+) \| (?:([0-9.]+)x)? \|$",
                          re.MULTILINE)
_SIZE_GOAL = re.compile(r"^\| (shm [^|]+?, p=(\d)) \| ([^|]+?) \| (PASS|MISS|n/a \(not measured\)) "
                        r"\|$", re.MULTILINE)
_WORST = re.compile(r"^(?:worst (\d+ (?:B|KiB|MiB)): )?([0-9.]+) vs ([0-9.]+) (us|GB/s) "
                    r"\(([+-]?[0-9.]+)( us|x)\)")


def _barrier_table(text: str) -> dict:
    """{backend: (us, ratio or None)} of the barrier at p = 2."""
    block = text.split("### barrier, p = 2")[1].split("###")[0]
    return {backend: (float(us), float(ratio) if ratio else None)
            for backend, _, us, ratio in _BARRIER_ROW.findall(block)}


def _half(shown: str, unit: str) -> float:
    """Half the last printed digit: GB/s to 3 significant digits, us to 0.01 (from 100: 1)."""
    value = float(shown)
    return 0.0051 * value if unit == "GB/s" else (0.005 if "." in shown else 0.5)


def _check_size_goals(text: str, tables: dict, barrier: dict) -> None:
    """Each goal at every size (run at p = 2 only) agrees with its limit and with the tables'
    figures at the size it names."""
    block = text.split("### Goals at every size")[1].split("### Earlier goals")[0]
    lines = _SIZE_GOAL.findall(block)
    assert len(lines) == 12, block
    measured_p2 = 0
    for goal, p, measured, verdict in lines:
        if p == "4" or ("MPI native" in goal and "mpi" not in BACKENDS):
            assert (measured, verdict) == ("-", "n/a (not measured)"), goal
            continue
        measured_p2 += 1
        match = _WORST.match(measured)
        assert match, (goal, measured)
        size, ours_text, theirs_text, unit, figure, kind = match.groups()
        ours, theirs, figure = float(ours_text), float(theirs_text), float(figure)
        ours_half, theirs_half = _half(ours_text, unit), _half(theirs_text, unit)
        if kind == " us":  # ours - theirs, printed to 0.01 us
            assert figure == pytest.approx(ours - theirs, abs=ours_half + theirs_half + 0.005)
        else:  # a ratio of times, or of bandwidths (ours over theirs), printed to 0.01
            assert _ratio_shown(figure, ours, theirs, 1, 0.005, theirs_half, ours_half)
        limit = float(re.search(r"([0-9.]+)(?: us|x)", re.split("<=|>=", goal)[-1])[1])
        if abs(figure - limit) > 0.005:  # a verdict at the limit could go either way
            assert (verdict == "PASS") == ((figure >= limit) if ">=" in goal
                                           else (figure <= limit)), (goal, measured)
        # the figures are the tables' at the size named
        name = goal.split()[1]
        if size is None:
            column = {b: us for b, (us, _) in barrier.items()}
        else:
            number, scale = size.split()
            collective = name if name in ("all_reduce", "broadcast") else "all_reduce"
            column = {b: (busbw if unit == "GB/s" else us)
                      for n, b, _, us, _, busbw, _ in tables[(collective, 2)]
                      if n == int(number) * _SIZE[scale]}
        mine = {"AVERAGE": "shm AVERAGE", "plain": "shm plain loop"}.get(name, "shm")
        other = "shm" if "SUM" in goal else "MPI native"
        slack = 0.051 if unit == "us" else 0.0
        assert ours == pytest.approx(column[mine], abs=ours_half + slack), (goal, measured)
        assert theirs == pytest.approx(column[other], abs=theirs_half + slack), (goal, measured)
    assert measured_p2 == (6 if "mpi" in BACKENDS else 2)


def test_bench_collectives_reports_a_job_past_its_time_limit(tmp_path):
    backends = ["shm"] + (["mpi"] if "mpi" in BACKENDS else [])
    result = _run("bench_collectives.py",
                  ["--backends", ",".join(backends), "--world-sizes", "2", "--sizes", "4",
                   "--collectives", "all_reduce", "--iters", "1000000", "--job-timeout", "4",
                   "--repeats", "1"])
    # every job's own line, so a job that failed another way names how
    failures = [line for line in result.stdout.splitlines() if line.startswith("FAILED")]
    assert result.returncode == 1, (failures, result.stderr[-3000:])
    for backend in backends:
        assert f"Failed job: bench_collectives.py job on backend '{backend}' with 2 ranks ran " \
               f"past its time limit" in result.stdout, (failures, result.stderr[-3000:])


_P, _N = 3, 5  # ranks as threads; float32 in each rank's part of a message


def _inputs(bufs, name):
    """Every rank's ``name`` buffer, copied: a call's result is made from these before any
    rank writes its own (a reduce writes in place)."""
    return [b[name].copy() for b in bufs]


def _sum_blocks(sends, rank, shift=0, ranks=None):
    """Rank ``rank``'s reduce-scatter of the ranks' ``sends`` (block ``rank + shift``, summed
    over ``ranks``, all by default): a right one, or one of the faults the check must see."""
    block = (rank + shift) % _P
    return np.sum([sends[r][block * _N:(block + 1) * _N] for r in ranks or range(_P)], axis=0)


def _block(whole, k):
    return whole[k % _P * _N:(k % _P + 1) * _N]


def _on_root(rank, name, value):
    """What a rooted call leaves: ``value`` in the root's ``name``, nothing elsewhere."""
    return {name: value} if rank == 0 else {}


_ALL = tuple(range(_P))
_RESULTS = {  # (collective, fault): (each rank's result {buffer: value}, the ranks that raise)
    ("reduce_scatter", None): (
        lambda bufs, rank: {"out": _sum_blocks(_inputs(bufs, "send"), rank)}, ()),
    ("reduce_scatter", "another rank's block"): (
        lambda bufs, rank: {"out": _sum_blocks(_inputs(bufs, "send"), rank, shift=1)}, _ALL),
    ("reduce_scatter", "a rank left out"): (
        lambda bufs, rank: {"out": _sum_blocks(_inputs(bufs, "send"), rank, ranks=[0, 1])},
        _ALL),
    ("reduce_scatter", "elements moved"): (
        lambda bufs, rank: {"out": _sum_blocks(_inputs(bufs, "send"), rank)[::-1]}, _ALL),
    ("reduce", None): (
        lambda bufs, rank: _on_root(rank, "buf", np.sum(_inputs(bufs, "buf"), axis=0)), ()),
    ("reduce", "a rank left out"): (
        lambda bufs, rank: _on_root(rank, "buf", np.sum(_inputs(bufs, "buf")[:2], axis=0)),
        (0,)),
    ("reduce", "elements moved"): (
        lambda bufs, rank: _on_root(rank, "buf", np.sum(_inputs(bufs, "buf"), axis=0)[::-1]),
        (0,)),
    ("reduce", "the others' buffers changed"): (
        lambda bufs, rank: {"buf": np.sum(_inputs(bufs, "buf"), axis=0)}, (1, 2)),
    ("gather", None): (
        lambda bufs, rank: _on_root(rank, "out", np.concatenate(_inputs(bufs, "send"))), ()),
    ("gather", "blocks out of rank order"): (
        lambda bufs, rank: _on_root(rank, "out", np.concatenate(_inputs(bufs, "send")[::-1])),
        (0,)),
    ("gather", "a block left unwritten"): (
        lambda bufs, rank: _on_root(rank, "out", np.concatenate(
            _inputs(bufs, "send")[:-1] + [_block(bufs[0]["out"], -1)])), (0,)),
    ("gather", "elements moved"): (
        lambda bufs, rank: _on_root(rank, "out", np.concatenate(
            [send[::-1] for send in _inputs(bufs, "send")])), (0,)),
    ("scatter", None): (
        lambda bufs, rank: {"out": _block(bufs[0]["send"], rank).copy()}, ()),
    ("scatter", "another rank's block"): (
        lambda bufs, rank: {"out": _block(bufs[0]["send"], rank + 1).copy()}, _ALL),
    ("scatter", "a rank's own input read"): (
        lambda bufs, rank: {"out": _block(bufs[rank]["send"], rank).copy()}, (1, 2)),
    ("scatter", "elements moved"): (
        lambda bufs, rank: {"out": _block(bufs[0]["send"], rank)[::-1].copy()}, _ALL)}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("collective, fault", list(_RESULTS))
def test_each_check_compares_its_ranks_with_numpy(collective, fault):
    """The check each job makes of its reduce-scatters, reduces (root 0), gathers and scatters,
    on three ranks as threads sharing their buffers: a right result passes on every rank, each
    fault raises on the ranks it wrongs, naming the operation, its size and the rank."""
    count = _N if collective == "reduce" else _P * _N
    result, raising = _RESULTS[(collective, fault)]
    barrier, bufs, errors = threading.Barrier(_P, timeout=10), [None] * _P, [None] * _P

    def rank_main(rank: int) -> None:
        b = bufs[rank] = collective_calls.buffers(collective, count, _P)

        def call() -> None:
            barrier.wait()  # every rank's input is filled
            written = result(bufs, rank)
            barrier.wait()  # every rank read the inputs before any is written or zeroed
            for name, value in written.items():
                b[name][...] = value
        try:
            collective_calls.check(collective, b, call, rank, _P)
        except Exception as exc:  # noqa: BLE001 - each rank's, judged below
            errors[rank] = exc

    threads = [threading.Thread(target=rank_main, args=(r,)) for r in range(_P)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads)
    assert [r for r, error in enumerate(errors) if error is not None] == list(raising), errors
    for rank in raising:
        assert type(errors[rank]) is RuntimeError and str(errors[rank]).startswith(
            f"{collective} of {count * 4} B on rank {rank} of {_P} gave"), errors[rank]


def test_pair_shm_mpi_judges_the_latency_goals_from_its_pairs():
    import pair_shm_mpi
    rows = []
    for collective, nbytes, ours_us, mpi_us in (("all_reduce", 4, 2.5, 2.0),
                                                ("all_reduce", 1024, 3.5, 2.0),
                                                ("broadcast", 4, 1.8, 1.0),
                                                ("barrier", 0, 1.0, 0.5)):
        base = {"collective": collective, "world_size": 2, "bytes": nbytes}
        rows += [dict(base, backend="shm", seconds=ours_us * 1e-6, ratio=ours_us / mpi_us),
                 dict(base, backend="MPI native", seconds=mpi_us * 1e-6)]
    text = pair_shm_mpi.report(rows, "python benchmarks/pair_shm_mpi.py")
    assert "| all_reduce | 2 | 1 KiB | 3.50 | 2.00 | 1.750x | +1.50 |" in text
    assert "| barrier | 2 | - | 1.00 | 0.50 | 2.000x | +0.50 |" in text
    verdicts = dict(re.findall(r"^\| (shm \w+ .*?) \| .*? \| (PASS|MISS) \|$", text, re.M))
    assert verdicts == {  # the all-reduce judged at its worst size, 1 KiB (+1.5 us)
        "shm all_reduce 4 B - 1 KiB <= MPI native + 1 us, p=2": "MISS",
        "shm broadcast 4 B - 1 KiB <= MPI native + 1 us, p=2": "PASS",
        "shm barrier <= MPI native + 1 us, p=2": "PASS"}, verdicts


def test_pair_shm_mpi_hands_our_calls_2d_views_with_matrix():
    import pair_shm_mpi
    seen = []
    dist = types.SimpleNamespace(
        broadcast=lambda t, src: seen.append(("broadcast", t.shape, t.base is not None)),
        all_gather_into_tensor=lambda out, t: seen.append(("all_gather", out.shape, t.shape)))
    comm = types.SimpleNamespace(Get_size=lambda: 2, Bcast=None, Allgather=None)
    for collective, nbytes in (("broadcast", 16), ("broadcast", 12), ("all_gather", 16)):
        for matrix in (False, True):
            calls = pair_shm_mpi.contenders(collective, nbytes, [], comm, dist, None, np,
                                            matrix)
            calls[pair_shm_mpi.ours_name(collective)]()
    assert seen == [("broadcast", (4,), False), ("broadcast", (2, 2), True),
                    ("broadcast", (3,), False), ("broadcast", (1, 3), True),
                    ("all_gather", (4,), (2,)), ("all_gather", (2, 2), (2,))], seen


@pytest.mark.skipif("mpi" not in BACKENDS, reason="needs mpi4py and mpiexec")
def test_pair_shm_mpi_runs_ours_and_mpis_in_turns_and_writes_its_section(tmp_path):
    out = tmp_path / "pairs.md"
    result = _run("pair_shm_mpi.py", ["--sizes", "4,4K", "--collectives",
                                      "all_reduce,broadcast,barrier,all_gather", "--turns",
                                      "2", "--calls", "3", "--output", str(out)], timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    text = out.read_text()
    assert "<!-- pair_shm_mpi:start -->" in text and "<!-- pair_shm_mpi:end -->" in text
    pairs = re.findall(r"^\| (all_reduce|broadcast|barrier|all_gather) \| 2 \| "
                       r"(\S+(?: \S+)?) \| ([0-9.]+) \| ([0-9.]+) \| ([0-9.]+)x \| "
                       r"([+-][0-9.]+) \|$", text, re.M)
    assert [(c, s) for c, s, *_ in pairs] == [("all_reduce", "4 B"), ("all_reduce", "4 KiB"),
                                             ("broadcast", "4 B"), ("broadcast", "4 KiB"),
                                             ("barrier", "-"), ("all_gather", "8 B"),
                                             ("all_gather", "4 KiB")], pairs
    for _, _, ours, mpi, _, diff in pairs:  # the difference is that of the two times shown
        assert abs(float(ours) - float(mpi) - float(diff)) <= 0.011, (ours, mpi, diff)
    goals = re.findall(r"^\| (shm .*?) \| .*? \| (PASS|MISS) \|$", text, re.M)
    assert len(goals) == 4, goals  # three latency goals and the 4 KiB all-reduce's busbw
