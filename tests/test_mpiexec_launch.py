"""``mpiexec_launch``: a job is run again only when mpiexec's own launcher did not start."""
from __future__ import annotations

import subprocess
import sys

import pytest

from mpiexec_launch import START_ATTEMPTS, START_FAILURE, run_until_launched, start_until_launched

pytestmark = pytest.mark.timeout(30)

RANK_FAILED = "rank 1 failed: ValueError: wrong sum"


def runs(*outputs):
    """A run_once that returns ``outputs`` one after the other, and the list of its calls."""
    calls = []

    def run_once():
        calls.append(len(calls))
        return outputs[len(calls) - 1]
    return run_once, calls


def test_a_launcher_that_did_not_start_is_run_again_until_a_run_starts():
    run_once, calls = runs(f"x\n{START_FAILURE}\n", "job output")
    assert run_until_launched(run_once) == "job output" and len(calls) == 2


def test_a_real_failure_is_never_run_again():
    run_once, calls = runs(RANK_FAILED, "job output")
    assert run_until_launched(run_once) == RANK_FAILED and len(calls) == 1
    # the message, but a rank left its trace: that run is the caller's to judge
    run_once, calls = runs(START_FAILURE, "job output")
    assert run_until_launched(run_once, output_of=lambda out: "") == START_FAILURE
    assert len(calls) == 1


def test_the_last_attempt_is_handed_back_as_it_is():
    run_once, calls = runs(*[START_FAILURE.encode()] * (START_ATTEMPTS + 1))
    assert run_until_launched(run_once) == START_FAILURE.encode()
    assert len(calls) == START_ATTEMPTS


def test_an_exception_is_run_again_only_with_the_launchers_message():
    calls = []

    def fails_then_runs():
        calls.append(1)
        if len(calls) == 1:
            raise AssertionError(f"ranks [0, 1] reported nothing\n{START_FAILURE}")
        return "ok"
    assert run_until_launched(fails_then_runs) == "ok" and len(calls) == 2

    def rank_fails():
        calls.append(1)
        raise AssertionError(RANK_FAILED)
    calls.clear()
    with pytest.raises(AssertionError, match="wrong sum"):
        run_until_launched(rank_fails)
    assert len(calls) == 1


def test_a_job_left_running_is_started_again_after_the_launcher_failed(tmp_path):
    """The first start prints the launcher's message and ends; the second leaves a rank's
    trace and runs on: that one is handed back, still running."""
    log, trace, starts = tmp_path / "mpiexec.log", tmp_path / "started_0.json", []
    script = ("import sys, time, pathlib\n"
              "if sys.argv[1] == '0':\n"
              f"    print({START_FAILURE!r}); sys.exit(1)\n"
              f"pathlib.Path({str(trace)!r}).write_text('{{}}'); time.sleep(20)\n")

    def start():
        with open(log, "wb") as out:
            starts.append(subprocess.Popen([sys.executable, "-c", script, str(len(starts))],
                                           stdout=out, stderr=subprocess.STDOUT))
        return starts[-1]
    try:
        job = start_until_launched(start, trace.exists, log, limit=10.0)
        assert len(starts) == 2 and job is starts[1] and job.poll() is None
        assert starts[0].returncode == 1
    finally:
        for proc in starts:
            proc.kill()
            proc.wait(10)
