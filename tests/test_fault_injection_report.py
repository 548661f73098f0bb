"""scripts/fault_injection_report.py: each fault is run several times and summarised as min /
median / max with what the runs left behind; rows appear as they are measured; the tracked
document is written only when asked (the faults themselves are replaced by instant fakes here,
except for a real leftover process and segment)."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def report(monkeypatch, capsys, tmp_path):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))  # as when run as a script
    spec = importlib.util.spec_from_file_location(
        "fault_injection_report_under_test", REPO_ROOT / "scripts" / "fault_injection_report.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look themselves up
    spec.loader.exec_module(module)
    # Whatever a run writes by default lands here, never in the project's document.
    (tmp_path / "project" / "docs").mkdir(parents=True)
    monkeypatch.setattr(module, "ROOT", tmp_path / "project")
    monkeypatch.setattr(module, "DOC", tmp_path / "project" / "docs" / "fault-tolerance.md")
    module.printed, module.seen_before = [], []

    def runner(label, times=(0.5,)):
        """A fault that notes which rows were printed before each of its runs."""
        calls = []

        def run(tmp: Path):
            assert tmp.is_dir()
            module.printed.extend(capsys.readouterr().out.splitlines())
            module.seen_before.append((label, [x for x in module.printed if "fake" in x]))
            calls.append(tmp)
            return module.Run(times[(len(calls) - 1) % len(times)], True, f"{label} measured")
        return run

    module.fake = lambda label, backend="shm", **kw: module.Fault(f"fake {label}", backend, 3,
                                                                  runner(label, **kw))
    rows = [module.fake(f"row {i}", backend) for i, backend in enumerate(["shm", "tcp"] * 3)]
    monkeypatch.setattr(module, "faults", lambda: rows)
    written = []
    real_write = module.write_table
    monkeypatch.setattr(module, "write_table",
                        lambda doc, text: (written.append(doc), real_write(doc, text)))
    module.written = written
    return module


def test_each_row_is_printed_before_the_next_is_measured(report, capsys):
    assert report.main([]) == 0
    report.printed.extend(capsys.readouterr().out.splitlines())
    assert len(report.seen_before) == 6 * 3, "each fault runs 3 times by default"
    for i, (label, already) in enumerate(report.seen_before):
        assert len(already) == i // 3, f"before a run of {label!r}, {len(already)} rows shown"
    assert report.printed[-1].startswith("passed 6 of 6; no document written")


def test_the_document_is_written_only_when_asked(report, tmp_path):
    report.main([])
    assert report.written == [], "a run without --doc must not touch the tracked document"
    doc = tmp_path / "faults.md"
    doc.write_text(f"# Faults\n\nbefore\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.main(["--doc", str(doc), "--runs", "2"])
    text = doc.read_text()
    assert report.written == [doc] and "old" not in text and "Passed 6 of 6" in text
    assert "2 runs per row" in text
    assert "| time (s): min / median / max | left behind | outcome |" in text
    assert "| fake row 1 | tcp | 3 | 0.500 / 0.500 / 0.500 | nothing | ok: row 1 measured |" \
        in text
    assert text.startswith("# Faults\n\nbefore\n") and text.endswith("after\n")
    report.main(["--doc"])  # no path: the project's document (redirected by the fixture)
    assert report.written[-1] == report.DOC and "Passed 6 of 6" in report.DOC.read_text()


def test_a_row_gives_min_median_max_of_its_runs(report, monkeypatch, tmp_path):
    rows = [report.fake("timed", times=(0.3, 0.1, 0.2))]
    monkeypatch.setattr(report, "faults", lambda: rows)
    out = tmp_path / "rows.json"
    assert report.main(["--json", str(out)]) == 0
    import json
    [row] = json.loads(out.read_text())
    assert row["seconds"] == {"min": 0.1, "median": 0.2, "max": 0.3} and row["runs"] == 3
    assert [r["seconds"] for r in row["each_run"]] == [0.3, 0.1, 0.2]
    assert report.times(row) == "0.100 / 0.200 / 0.300"


def test_a_run_over_the_limit_or_not_run_fails_its_row(report, monkeypatch):
    slow = report.fake("slow", times=(0.2, report.DETECT_LIMIT_S + 2))
    calls = []

    def unavailable(tmp):
        calls.append(tmp)
        return report.rows.not_run("no such machine here")
    missing = report.Fault("fake missing", "mpi", 3, unavailable)
    monkeypatch.setattr(report, "faults", lambda: [slow, missing])
    done = report.run_all(3, report=lambda row: None)
    assert [r["ok"] for r in done] == [False, False]
    assert "runs 1, 3: slow measured; run 2: slow measured (after 12.0 s, over the 10 s limit)" \
        == done[0]["outcome"]
    assert len(calls) == 1, "a fault that cannot be injected here is not tried again"
    assert done[1]["outcome"] == "not run: no such machine here" and done[1]["seconds"] is None


def test_only_measures_the_matching_rows(report, capsys):
    assert report.main(["--only", "ROW [13]", "--runs", "1"]) == 0
    assert [label for label, _ in report.seen_before] == ["row 1", "row 3"]
    with pytest.raises(SystemExit):
        report.main(["--only", "row 1", "--doc"])  # a partial table would replace the whole
    with pytest.raises(SystemExit):
        report.main(["--only", "no such row"])
    with pytest.raises(SystemExit):
        report.main(["--runs", "0"])


def test_processes_and_segments_left_behind_are_named_and_removed(report, monkeypatch):
    left = {}

    def leaky(tmp):
        # An orphan (its shell exits at once, so init adopts it) and a segment whose creator,
        # that shell, is gone: nobody would remove either.
        shell = subprocess.Popen(["sh", "-c", "sleep 60 >/dev/null & echo $!"],
                                 stdout=subprocess.PIPE, text=True)
        left["pid"] = int(shell.communicate(timeout=10)[0])
        left["segment"] = f"nf_{shell.pid}_{os.urandom(4).hex()}"
        Path("/dev/shm", left["segment"]).write_bytes(b"x")
        return report.Run(0.1, True, "leaked")
    monkeypatch.setattr(report, "faults", lambda: [report.Fault("fake leaky", "shm", 2, leaky)])
    [row] = report.run_all(1, report=lambda row: None)
    assert not row["ok"]
    assert f"pid {left['pid']} (sleep 60)" in row["left"]
    assert f"segment {left['segment']}" in row["left"]
    assert not Path("/dev/shm", left["segment"]).exists()
    assert not report.rows.alive(left["pid"])
