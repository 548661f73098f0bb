"""scripts/fault_injection_report.py: rows appear as they are measured; the tracked document
is written only when asked (the faults themselves are replaced by instant fakes here)."""
from __future__ import annotations

import importlib.util

import pytest

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def report(monkeypatch, capsys, tmp_path):
    monkeypatch.syspath_prepend(str(REPO_ROOT / "scripts"))  # as when run as a script
    spec = importlib.util.spec_from_file_location(
        "fault_injection_report_under_test", REPO_ROOT / "scripts" / "fault_injection_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    # Whatever a run writes by default lands here, never in the project's document.
    (tmp_path / "project" / "docs").mkdir(parents=True)
    monkeypatch.setattr(module, "ROOT", tmp_path / "project")
    monkeypatch.setattr(module, "DOC", tmp_path / "project" / "docs" / "fault-tolerance.md",
                        raising=False)
    printed, seen_before = [], []

    def measure(label):
        printed.extend(capsys.readouterr().out.splitlines())
        seen_before.append((label, [line for line in printed if "fake" in line]))
        return module.Row(f"fake {label}", "shm", 3, 0.5, True, "measured")

    monkeypatch.setattr(module, "_collective_row", lambda f, b, v, label: measure(label))
    monkeypatch.setattr(module.mpi_rows, "stop_on_one_host", lambda row, limit: measure("mpi"))
    def several(labels, rows):
        """Rows measured one after the other by one function, added to ``rows`` as they come."""
        made = [] if rows is None else rows
        for label in labels:
            made.append(measure(label))
        return made if rows is None else None

    monkeypatch.setattr(module.mpi_rows, "out_of_pid_sight",
                        lambda row, limit, rows=None: several(["pid 1", "pid 2"], rows))
    monkeypatch.setattr(module, "_netns_row", lambda: measure("netns"))
    monkeypatch.setattr(module, "_checkpoint_row", lambda label, damage: measure(label))
    monkeypatch.setattr(module, "_launcher_rows",
                        lambda tmp, rows=None: several(["term", "restart"], rows))
    written = []
    real_write = module.write_table
    monkeypatch.setattr(module, "write_table",
                        lambda doc, text: (written.append(doc), real_write(doc, text)))
    module.seen_before, module.written, module.printed = seen_before, written, printed
    return module


def test_each_row_is_printed_before_the_next_is_measured(report, capsys):
    assert report.main([]) == 0
    report.printed.extend(capsys.readouterr().out.splitlines())
    assert len(report.seen_before) == 18
    for i, (label, already) in enumerate(report.seen_before):
        assert len(already) == i, f"before measuring {label!r}, {len(already)} of {i} rows shown"
    assert report.printed[-1].startswith("passed 18 of 18; no document written")


def test_the_document_is_written_only_when_asked(report, tmp_path, monkeypatch):
    report.main([])
    assert report.written == [], "a run without --doc must not touch the tracked document"
    doc = tmp_path / "faults.md"
    doc.write_text(f"# Faults\n\nbefore\n{report.BEGIN}\nold\n{report.END}\nafter\n")
    report.main(["--doc", str(doc)])
    text = doc.read_text()
    assert report.written == [doc] and "old" not in text and "Passed 18 of 18" in text
    assert text.startswith("# Faults\n\nbefore\n") and text.endswith("after\n")
    report.main(["--doc"])  # no path: the project's document (redirected by the fixture)
    assert report.written[-1] == report.DOC and "Passed 18 of 18" in report.DOC.read_text()
