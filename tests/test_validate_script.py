"""scripts/validate_distributed_training.py as users run it: a subprocess that starts real ranks.

Healthy runs must pass every check; a corrupted contribution, a crashed rank and a launch that
runs out of time must each turn into FAILED lines and a non-zero exit code, never a hang, and no
process may outlive the run.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from dist_harness import mpi_available

pytestmark = pytest.mark.timeout(300)

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "validate_distributed_training.py"
INJECT = "NEURAL_ARCH_VALIDATE_INJECT_FAULT"
CHECKS = ["environment", "all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce",
          "gather", "scatter", "send_recv", "barrier", "all_gather_object",
          "broadcast_object_list", "async_ops", "ddp_manual", "ddp_automatic", "sampling",
          "checkpoint", "fault_detection"]
needs_mpi = pytest.mark.skipif(not mpi_available(), reason="needs mpiexec and mpi4py")


def processes_mentioning(tag: str) -> list[int]:
    """Live processes whose command line contains ``tag`` (zombies have none)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if tag.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                found.append(int(entry))
        except OSError:
            pass
    return found


def leaked_segments(before: set) -> list[str]:
    """Our shared-memory segments (nf_<creator pid>_...) left in /dev/shm by a dead creator."""
    leaked = []
    for name in sorted(set(os.listdir("/dev/shm")) - before):
        parts = name.split("_")
        if name.startswith("nf_") and len(parts) > 2 and parts[1].isdigit() \
                and not os.path.exists(f"/proc/{parts[1]}"):
            leaked.append(name)
    return leaked


def run_script(tmp_path: Path, backend: str, world_size, *extra: str, inject: str = "",
               path: str = ""):
    """Run the script with its work directory under ``tmp_path``; returns (process, report).
    ``path`` replaces PATH (to hide an mpiexec that is on it)."""
    report_path = tmp_path / "report.json"
    segments_before = set(os.listdir("/dev/shm"))
    env = {k: v for k, v in os.environ.items() if k != INJECT}
    env["TMPDIR"] = str(tmp_path)  # so every rank's command line names tmp_path
    if path:
        env["PATH"] = path
    if inject:
        env[INJECT] = inject
    cmd = [sys.executable, str(SCRIPT), "--backend", backend, "--world-size", str(world_size),
           "--output", str(report_path), *extra]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=240)
        deadline = time.monotonic() + 10
        while processes_mentioning(str(tmp_path)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert processes_mentioning(str(tmp_path)) == [], "processes outlived the run"
        assert leaked_segments(segments_before) == []
    finally:
        for pid in processes_mentioning(str(tmp_path)):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    report = json.loads(report_path.read_text()) if report_path.exists() else None
    return proc, report


def check_report(proc, report, backend: str, world_size: int) -> dict:
    """The SPEC's schema, the console lines and the exit code all tell the same story."""
    assert report is not None, proc.stdout + proc.stderr
    assert set(report) == {"overall", "passed", "failed", "skipped", "backend", "world_size",
                           "checks"}
    assert (report["backend"], report["world_size"]) == (backend, world_size)
    assert [c["name"] for c in report["checks"]] == CHECKS
    statuses = {}
    for check in report["checks"]:
        assert set(check) == {"name", "status", "seconds", "details"}
        assert check["status"] in ("PASSED", "FAILED", "SKIPPED")
        assert isinstance(check["seconds"], float) and check["seconds"] >= 0
        assert isinstance(check["details"], str) and check["details"]
        statuses[check["name"]] = check["status"]
    counts = {s: list(statuses.values()).count(s) for s in ("PASSED", "FAILED", "SKIPPED")}
    passed, skipped = counts["PASSED"], counts["SKIPPED"]
    assert (report["passed"], report["failed"], report["skipped"]) == \
        (passed, counts["FAILED"], skipped)
    assert report["overall"] == ("FAILED" if counts["FAILED"] else "SKIPPED" if skipped
                                 else "PASSED")
    assert proc.returncode == (0 if report["overall"] == "PASSED" else 1), proc.stderr
    lines = [ln for ln in proc.stdout.splitlines() if re.match(r"(PASSED|FAILED|SKIPPED)  ", ln)]
    assert len(lines) == len(CHECKS), proc.stdout
    for line, check in zip(lines, report["checks"]):
        assert re.match(rf"{check['status']}  {check['name']}  \(\d+\.\d\d s\)  \S", line), line
    overall, where = proc.stdout.rstrip().splitlines()[-2:]
    assert overall == (f"OVERALL: {report['overall']} ({passed}/{len(CHECKS)} checks passed"
                       + (f", {skipped} skipped)" if skipped else ")"))
    assert where.startswith("JSON report: /") and where.endswith(".json"), where
    return {c["name"]: c for c in report["checks"]}


@pytest.mark.parametrize("backend, world_size", [
    ("shm", 2), ("tcp", 3), ("gloo", 2),
    pytest.param("mpi", 2, marks=needs_mpi)])
def test_healthy_run_passes_every_check(tmp_path, backend, world_size):
    proc, report = run_script(tmp_path, backend, world_size)
    checks = check_report(proc, report, backend, world_size)
    failed = {n: c["details"] for n, c in checks.items() if c["status"] != "PASSED"}
    assert failed == {}, proc.stdout
    concrete = "shm" if backend == "gloo" else backend
    assert f"backend {concrete}" in checks["environment"]["details"]
    assert f"rank {world_size - 1} SIGKILLed" in checks["fault_detection"]["details"]


def assert_exactly_those_failed(proc, checks: dict, injected: list[str], world_size: int):
    assert proc.returncode == 1
    assert [n for n, c in checks.items() if c["status"] == "FAILED"] == injected, proc.stdout
    for check in injected:
        details = checks[check]["details"]
        if check == "fault_detection":
            assert f"rank {world_size - 1}: did not SIGKILL itself" in details
        else:
            assert "mismatch" in details, details


@pytest.mark.parametrize("backend, check", [
    ("shm", "all_reduce"), ("shm", "checkpoint"), ("tcp", "ddp_manual"),
    ("tcp", "fault_detection"), pytest.param("mpi", "ddp_automatic", marks=needs_mpi)])
def test_a_corrupted_contribution_fails_exactly_that_check(tmp_path, backend, check):
    world_size = 2 if backend == "shm" else 3
    proc, report = run_script(tmp_path, backend, world_size, inject=check)
    assert_exactly_those_failed(proc, check_report(proc, report, backend, world_size), [check],
                                world_size)


@pytest.mark.slow
@pytest.mark.parametrize("half", [0, 1])
def test_every_check_fails_when_corrupted_and_only_those_corrupted_fail(tmp_path, half):
    # Every other check corrupted in one run (the two runs between them corrupt each check):
    # each corrupted check fails, and a corruption of one check never fails a check beside it.
    # A corruption that spilled two checks on would hide in the same run; the single-check
    # runs above cover the checks whose state lives on (the training and checkpoint ones).
    injected = CHECKS[half::2]
    proc, report = run_script(tmp_path, "shm", 2, inject=",".join(injected))
    assert_exactly_those_failed(proc, check_report(proc, report, "shm", 2), injected, 2)


def reasons_by_rank(details: str) -> dict[int, str]:
    """Split a merged verdict ("ranks 0, 2: why; rank 1: other") back into one reason a rank."""
    heads = list(re.finditer(r"(?:^|; )ranks? ([\d, ]+): ", details))
    reasons = {}
    for head, following in zip(heads, heads[1:] + [None]):
        why = details[head.end():following.start() if following else len(details)]
        reasons.update({int(r): why for r in head.group(1).split(",")})
    return reasons


def test_a_crashed_rank_fails_the_remaining_checks(tmp_path):
    proc, report = run_script(tmp_path, "tcp", 3, inject="sampling:crash")
    checks = check_report(proc, report, "tcp", 3)
    before, after = CHECKS[:CHECKS.index("sampling")], ["sampling", "checkpoint"]
    assert all(checks[n]["status"] == "PASSED" for n in before), proc.stdout
    for name in after:
        assert checks[name]["status"] == "FAILED"
        details = checks[name]["details"]
        # Which survivors report before the launcher stops them is a race; either way the dead
        # rank has no result, and a survivor that did report names rank 2 as the lost peer.
        reasons = reasons_by_rank(details)
        assert reasons[2].startswith("no result") and "SIGKILL" in reasons[2], details
        for survivor in (0, 1):
            why = reasons[survivor]
            assert why.startswith("no result") or "peer rank 2" in why or \
                why.startswith("not run: the process group failed"), details
    assert checks["fault_detection"]["status"] == "PASSED"


@needs_mpi
def test_mpiexec_next_to_the_python_is_found_when_not_on_path(tmp_path):
    beside = Path(sys.executable).parent / "mpiexec"
    if not beside.is_file():
        pytest.skip(f"no mpiexec next to {sys.executable}")
    hidden = os.pathsep.join(d for d in ("/usr/bin", "/bin") if not Path(d, "mpiexec").exists())
    proc, report = run_script(tmp_path, "mpi", 2, path=hidden)
    checks = check_report(proc, report, "mpi", 2)
    assert report["overall"] == "PASSED", proc.stdout + proc.stderr
    assert "backend mpi" in checks["environment"]["details"]


@needs_mpi
def test_a_crashed_rank_under_mpiexec_is_reported(tmp_path):
    proc, report = run_script(tmp_path, "mpi", 2, inject="checkpoint:crash")
    checks = check_report(proc, report, "mpi", 2)
    assert [n for n, c in checks.items() if c["status"] == "FAILED"] == ["checkpoint"]
    assert "no result (mpiexec exited with code" in checks["checkpoint"]["details"]


def test_a_launch_that_runs_out_of_time_is_reported(tmp_path):
    # Start-up and the staggered barrier alone take longer than half a second.
    start = time.monotonic()
    proc, report = run_script(tmp_path, "shm", 2, "--timeout", "0.5")
    checks = check_report(proc, report, "shm", 2)
    assert report["overall"] == "FAILED"
    timed_out = [n for n, c in checks.items() if "after the 0.5 s timeout" in c["details"]]
    assert timed_out and all(checks[n]["status"] == "FAILED" for n in timed_out), proc.stdout
    assert time.monotonic() - start < 120


@pytest.mark.parametrize("args, message", [
    (["--world-size", "1"], "--world-size must be >= 2"),
    (["--backend", "nccl"], "invalid choice: 'nccl'"),
    (["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0")])
def test_bad_arguments_are_refused(tmp_path, args, message):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path / "r.json"),
                           *args], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not (tmp_path / "r.json").exists()


def test_a_fault_injection_naming_no_check_is_refused(tmp_path):
    env = dict(os.environ, **{INJECT: "all_reduce, broadcast:crash,all_reduc"})
    proc = subprocess.run([sys.executable, str(SCRIPT), "--output", str(tmp_path / "r.json")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert proc.returncode == 2 and "names no check in ['all_reduc']" in proc.stderr, \
        proc.stderr
    assert not (tmp_path / "r.json").exists()


def import_script(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPT.parent))
    import validate_distributed_training
    import validation_launch
    return validate_distributed_training, validation_launch


def test_mpi_without_mpiexec_is_skipped_with_the_reason_and_the_report_is_named(
        tmp_path, monkeypatch, capsys):
    script, launch = import_script(monkeypatch)
    monkeypatch.setattr(launch, "find_mpiexec", lambda: None)
    monkeypatch.chdir(tmp_path)
    code = script.main(["--backend", "mpi"])  # no --output: the default file, named
    report_path = tmp_path / "distributed_validation.json"
    report = json.loads(report_path.read_text())
    out = capsys.readouterr().out
    checks = check_report(subprocess.CompletedProcess([], code, out, ""), report, "mpi", 2)
    assert code == 1 and report["overall"] == "SKIPPED" and report["skipped"] == len(CHECKS)
    for check in checks.values():
        assert check["status"] == "SKIPPED"
        assert check["details"].startswith("not run: mpiexec is neither on PATH nor next to "
                                           f"{sys.executable}")
    assert "FAILED" not in out
    assert out.rstrip().splitlines()[-1] == f"JSON report: {report_path}"


def test_find_mpiexec_looks_next_to_the_python(tmp_path, monkeypatch):
    _, launch = import_script(monkeypatch)
    bin_dir, empty = tmp_path / "venv" / "bin", tmp_path / "empty"
    bin_dir.mkdir(parents=True)
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(sys, "executable", str(bin_dir / "python"))
    assert launch.find_mpiexec() is None
    beside = bin_dir / "mpiexec"
    beside.write_text("#!/bin/sh\n")
    beside.chmod(0o755)
    assert launch.find_mpiexec() == str(beside)
    on_path = empty / "mpiexec"
    on_path.write_text("#!/bin/sh\n")
    on_path.chmod(0o755)
    assert launch.find_mpiexec() == str(on_path)  # PATH first, as a shell would


def test_help_shows_the_defaults():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True,
                          text=True, timeout=60)
    text = " ".join(proc.stdout.split())
    assert proc.returncode == 0, proc.stderr
    for default in ("(default: auto)", "(default: 2)", "(default: distributed_validation.json)",
                    "(default: 120.0)"):
        assert default in text, text
    assert "SKIPPED" in text


@pytest.mark.parametrize("n", [2, 3, 4, 5, 7])
def test_closed_form_references_match_a_brute_force_reduction(n):
    sys.path.insert(0, str(SCRIPT.parent))
    try:
        from neural_arch.distributed import ReduceOp
        from validation_collectives import OPS, rank_input, reduced
    finally:
        sys.path.remove(str(SCRIPT.parent))
    brute = {ReduceOp.SUM: np.sum, ReduceOp.PRODUCT: np.prod, ReduceOp.MIN: np.min,
             ReduceOp.MAX: np.max, ReduceOp.AVERAGE: np.mean}
    for op in OPS:
        stacked = np.stack([rank_input(op, 101, r, n) for r in range(n)])
        want = brute[op](stacked, axis=0)
        np.testing.assert_array_equal(reduced(op, 101, n), want)
        # every input and result is an integer or half-integer exact in float16
        assert np.array_equal(want.astype(np.float16).astype(np.float64), want)
