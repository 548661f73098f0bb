"""The shared-memory all-reduce's tuning table: read, checked, looked up, followed by the ranks
with the reference's bits, and a disagreement between ranks refused by name."""
from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

from neural_arch.distributed.errors import CollectiveMismatchError
from neural_arch.distributed.reduce_ops import ReduceOp
from neural_arch.distributed.transports import shm
from neural_arch.distributed.transports.shm import direct, tuning, tuning_file
from neural_arch.distributed.transports.shm.tuning import Choice
from shm_cases import Calls, rank_order_reduction
from shm_testing import run_ranks, shm_names_of

pytestmark = pytest.mark.timeout(60)

TABLE = {"format": 1, "all_reduce": {
    "2": [{"up_to_bytes": 300 << 10, "algorithm": "split", "round_bytes": 64 << 10},
          {"up_to_bytes": 1 << 20, "algorithm": "whole", "round_bytes": 256 << 10}],
    "3": [{"up_to_bytes": 1 << 20, "algorithm": "split", "round_bytes": 512 << 10}]}}


@pytest.fixture
def table_file(tmp_path, monkeypatch):
    """Write ``TABLE`` (or a given table) and point ``NEURAL_ARCH_SHM_TUNING`` at it."""
    def write(table=TABLE):
        path = tmp_path / "tuning.json"
        path.write_text(json.dumps(table))
        monkeypatch.setenv(tuning.ENV_TABLE, str(path))
        tuning.forget()
        return str(path)
    yield write
    tuning.forget()


def test_lookup_follows_the_rows_and_clamps_rounds_to_the_workspace(table_file):
    table_file()
    ws = 2 << 20
    assert tuning.all_reduce_choice(2, 200 << 10, ws) == Choice("split", 64 << 10)
    assert tuning.all_reduce_choice(2, 300 << 10, ws) == Choice("split", 64 << 10)
    assert tuning.all_reduce_choice(2, (300 << 10) + 1, ws) == Choice("whole", 256 << 10)
    assert tuning.all_reduce_choice(2, 64 << 20, ws) == Choice("whole", 256 << 10)  # last row
    assert tuning.all_reduce_choice(3, 4 << 20, 128 << 10) == Choice("split", 128 << 10)
    assert tuning.all_reduce_choice(4, 4 << 20, ws) == tuning.default_choice(4)  # not named


def test_without_a_table_the_built_in_choice_stands(monkeypatch, tmp_path):
    monkeypatch.delenv(tuning.ENV_TABLE, raising=False)
    monkeypatch.setattr(tuning, "TABLE_FILE", str(tmp_path / "absent.json"))
    tuning.forget()
    try:
        assert tuning.all_reduce_choice(2, 8 << 20, 2 << 20) == Choice("whole", 1 << 20)
        assert tuning.all_reduce_choice(3, 8 << 20, 512 << 10) == Choice("split", 512 << 10)
        assert tuning.source() == ""
    finally:
        tuning.forget()


@pytest.mark.parametrize("row, message", [
    ({"up_to_bytes": 1024, "algorithm": "ring", "round_bytes": 65536}, "algorithm must be"),
    ({"up_to_bytes": 1024, "algorithm": "split", "round_bytes": 100}, "round_bytes must be"),
    ({"up_to_bytes": "1K", "algorithm": "split", "round_bytes": 65536}, "up_to_bytes must be"),
])
def test_a_bad_row_is_refused_naming_the_file_and_field(table_file, row, message):
    path = table_file({"format": 1, "all_reduce": {"2": [row]}})
    with pytest.raises(ValueError, match=message) as info:
        tuning.all_reduce_choice(2, 1 << 20, 2 << 20)
    assert path in str(info.value) and "all_reduce['2'][0]" in str(info.value)


def test_whole_is_refused_for_three_ranks_and_rows_must_increase(table_file):
    table_file({"format": 1, "all_reduce": {"3": [
        {"up_to_bytes": 1024, "algorithm": "whole", "round_bytes": 65536}]}})
    with pytest.raises(ValueError, match="'whole' for two ranks only"):
        tuning.table()
    table_file({"format": 1, "all_reduce": {"2": [
        {"up_to_bytes": 2048, "algorithm": "split", "round_bytes": 65536},
        {"up_to_bytes": 1024, "algorithm": "whole", "round_bytes": 65536}]}})
    with pytest.raises(ValueError, match=r"\[1\]: up_to_bytes must be an int above"):
        tuning.table()


def test_a_broken_package_table_warns_and_keeps_the_built_in_choice(monkeypatch, tmp_path):
    broken = tmp_path / "tuning_table.json"
    broken.write_text("{not json")
    monkeypatch.delenv(tuning.ENV_TABLE, raising=False)
    monkeypatch.setattr(tuning, "TABLE_FILE", str(broken))
    tuning.forget()
    try:
        with pytest.warns(RuntimeWarning, match="built-in choices stand"):
            assert tuning.all_reduce_choice(2, 8 << 20, 2 << 20) == tuning.default_choice(2)
    finally:
        tuning.forget()


def test_written_rows_merge_neighbours_and_read_back(tmp_path):
    path = str(tmp_path / "t.json")
    measured = [(256 << 10, Choice("split", 64 << 10)), (1 << 20, Choice("split", 64 << 10)),
                (4 << 20, Choice("whole", 1 << 20))]
    tuning.write(path, {2: measured}, {"cpus": 2})
    found = tuning.load(path)
    assert found.machine == tuning_file.machine()
    assert found.rows[2] == [(1 << 20, Choice("split", 64 << 10)),
                             (4 << 20, Choice("whole", 1 << 20))]
    assert found.peer_writes is False
    tuning.write(path, {2: measured}, {"cpus": 2}, peer_writes=True)
    assert tuning.load(path) == found._replace(peer_writes=True)


def test_a_file_keeps_a_table_per_machine_and_a_machine_reads_its_own(tmp_path, table_file):
    path = str(tmp_path / "t.json")
    here, there = tuning_file.machine(), "Some Other CPU, 64 CPUs"
    tuning.write(path, {2: [(1 << 20, Choice("split", 64 << 10))]}, machine=there)
    tuning.write(path, {2: [(1 << 20, Choice("whole", 128 << 10))]})
    tuning.write(path, {2: [(1 << 20, Choice("split", 256 << 10))]}, machine=there)  # replaced
    with open(path) as f:
        written = json.load(f)
    assert written["format"] == 2
    assert sorted(t["machine"] for t in written["machines"]) == sorted([here, there])
    assert tuning.load(path).rows[2] == [(1 << 20, Choice("whole", 128 << 10))]
    assert tuning.load(path, there).rows[2] == [(1 << 20, Choice("split", 256 << 10))]
    assert tuning.load(path, "Yet Another CPU, 1 CPUs") is None
    table_file(written)  # through the variable: this machine's rows are the ones in force
    assert tuning.all_reduce_choice(2, 1 << 20, 2 << 20) == Choice("whole", 128 << 10)
    assert here in tuning.source()


def test_another_machines_table_leaves_the_built_in_choice(tmp_path, table_file, monkeypatch):
    elsewhere = {"format": 2, "machines": [dict(TABLE, machine="Some Other CPU, 64 CPUs")]}
    del elsewhere["machines"][0]["format"]
    table_file(elsewhere)  # named by the variable: a warning says there is nothing for here
    with pytest.warns(RuntimeWarning, match="no table for this machine"):
        assert tuning.all_reduce_choice(2, 200 << 10, 2 << 20) == tuning.default_choice(2)
    assert tuning.source() == ""
    package = tmp_path / "package.json"  # the package's file: the built-in choice, silently
    package.write_text(json.dumps(elsewhere))
    monkeypatch.delenv(tuning.ENV_TABLE)
    monkeypatch.setattr(tuning, "TABLE_FILE", str(package))
    tuning.forget()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning: most machines have no table of their own
        assert tuning.all_reduce_choice(2, 200 << 10, 2 << 20) == tuning.default_choice(2)


def test_writing_into_a_format_1_file_keeps_a_named_machine_and_refuses_an_unnamed_one(
        tmp_path):
    there = "Some Other CPU, 64 CPUs"
    named = tmp_path / "named.json"
    named.write_text(json.dumps(dict(TABLE, machine=there)))
    assert tuning.load(str(named)) is None  # a format-1 table of another machine: not ours
    assert tuning.load(str(named), there).rows[3] == [(1 << 20, Choice("split", 512 << 10))]
    tuning.write(str(named), {2: [(1 << 20, Choice("whole", 128 << 10))]})
    written = json.loads(named.read_text())
    assert written["format"] == 2 and all("format" not in t for t in written["machines"])
    assert tuning.load(str(named), there).rows[3] == [(1 << 20, Choice("split", 512 << 10))]
    assert tuning.load(str(named)).rows[2] == [(1 << 20, Choice("whole", 128 << 10))]
    unnamed = tmp_path / "unnamed.json"
    unnamed.write_text(json.dumps(TABLE))
    with pytest.raises(ValueError, match="for any machine .* name its machine"):
        tuning.write(str(unnamed), {2: [(1 << 20, Choice("whole", 128 << 10))]})
    assert json.loads(unnamed.read_text()) == TABLE  # left as it was


@pytest.mark.parametrize("table, message", [
    ({"format": 3, "all_reduce": {}}, "format\" 1 or 2"),
    ({"format": True, "all_reduce": {}}, "format\" 1 or 2"),
    ({"format": 2, "machines": {}}, "must be a list of tables"),
    ({"format": 2, "machines": [{"all_reduce": {}}]}, "machines\\[0\\]: \"machine\" must name"),
    ({"format": 2, "machines": [{"machine": "A, 1 CPUs"}, {"machine": "A, 1 CPUs"}]},
     "more than one table"),
])
def test_a_malformed_file_is_refused_naming_the_field(table_file, table, message):
    path = table_file(table)
    with pytest.raises(ValueError, match=message) as info:
        tuning.table()
    assert path in str(info.value)


def test_the_package_file_holds_tables_for_named_machines():
    found = tuning.tables(tuning_file.read(tuning.TABLE_FILE), tuning.TABLE_FILE)
    assert found and all(t.machine and 2 in t.rows for t in found)


# ----- real ranks -----------------------------------------------------------------------------
SIZES = (200 << 10, 520 << 10)  # bytes: one in each row of the table, several rounds each


def tuned_all_reduces(rank, p, store, table_path):
    """SUM and AVERAGE of float32 and float16 at SIZES under ``table_path``'s choices; returns
    the (dtype, bytes, op) whose bits differ from the rank-order reference."""
    os.environ[tuning.ENV_TABLE] = table_path
    tuning.forget()
    t = shm.create(rank, p, store, 30.0)
    calls, wrong = Calls(), []
    try:
        for dtype in (np.float32, np.float16):
            for nbytes in SIZES:
                n = nbytes // np.dtype(dtype).itemsize
                for op in (ReduceOp.SUM, ReduceOp.AVERAGE):
                    inputs = [np.random.default_rng([r, n]).standard_normal(n).astype(dtype)
                              for r in range(p)]
                    buf = inputs[rank].copy()
                    t.collectives.all_reduce(buf, op, calls.fp("all_reduce", buf))
                    if buf.tobytes() != rank_order_reduction(inputs, op).tobytes():
                        wrong.append((np.dtype(dtype).name, nbytes, op.name))
        return wrong, [tuning.all_reduce_choice(p, s, t.layout.workspace_bytes) for s in SIZES]
    finally:
        t.close()


@pytest.mark.parametrize("p", [2, 3])
def test_ranks_follow_the_table_with_the_reference_bits(tmp_path, table_file, p):
    path = table_file()
    results = run_ranks(p, tuned_all_reduces, path, store_dir=str(tmp_path), timeout=50)
    assert all(r.ok for r in results), results
    for r in results:
        assert r.value[0] == [], f"rank {r.rank}: differs from the reference: {r.value[0]}"
    assert results[0].value[1] == ([Choice("split", 64 << 10), Choice("whole", 256 << 10)]
                                   if p == 2 else [Choice("split", 512 << 10)] * 2)
    assert shm_names_of(r.pid for r in results) == []


def disagreeing(rank, p, store, paths):
    """Rank r reads table ``paths[r]``; one all-reduce, whose error (if any) is returned."""
    os.environ[tuning.ENV_TABLE] = paths[rank]
    tuning.forget()
    t = shm.create(rank, p, store, 10.0)
    try:
        buf = np.ones(512 << 8, np.float32)  # 512 KiB
        try:
            t.collectives.all_reduce(buf, ReduceOp.SUM, Calls().fp("all_reduce", buf))
        except CollectiveMismatchError as exc:
            return str(exc)
        return None
    finally:
        t.close()


def test_ranks_given_different_tables_are_refused_by_name(tmp_path, table_file):
    split = table_file({"format": 1, "all_reduce": {"2": [
        {"up_to_bytes": 1 << 20, "algorithm": "split", "round_bytes": 128 << 10}]}})
    whole = str(tmp_path / "whole.json")
    with open(whole, "w") as f:
        json.dump({"format": 1, "all_reduce": {"2": [
            {"up_to_bytes": 1 << 20, "algorithm": "whole", "round_bytes": 1 << 20}]}}, f)
    results = run_ranks(2, disagreeing, [split, whole], store_dir=str(tmp_path), timeout=30)
    assert all(r.ok for r in results), results
    messages = [r.value for r in results]
    assert all(m and "split@128K" in m for m in messages), messages
    assert direct.ROUND_BYTES == tuning.DEFAULT_ROUND_BYTES
