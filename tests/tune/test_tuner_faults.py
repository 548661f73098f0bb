"""The tuner's faults: a trial that raises (recorded as failed, the study goes on), a tuner
killed with SIGKILL mid-study and started again (its trials' processes stopped; the study
resumes: no finished trial run again, no trial lost), a second tuner of a running study."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

optuna = pytest.importorskip("optuna")

from neural_arch import tune  # noqa: E402
from leftovers import alive  # noqa: E402
from leftovers_fixture import leftovers  # noqa: E402,F401 - nothing outlives a test

import tune_jobs  # noqa: E402

pytestmark = pytest.mark.timeout(120)
HERE = os.path.dirname(os.path.abspath(__file__))


def test_a_trial_that_raises_is_failed_and_the_study_goes_on(tmp_path):
    xs = [0.1, 0.9, 0.2, 0.3]
    results = tune.DistributedTuner(
        tune_jobs.failing_curve, {"x": tune.uniform(0.0, 1.0), "steps": 3, "sleep": 0.02},
        num_samples=4, max_concurrent_trials=2, local_dir=str(tmp_path),
        points_to_evaluate=[{"x": x} for x in xs]).tune()
    assert [row["state"] for row in results] == ["COMPLETE", "FAIL", "COMPLETE", "COMPLETE"]
    failed = results.trials[1]
    log = os.path.join(failed["dir"], "rank_0.log")
    assert failed["error"] == f"rank 0 of 1 raised ValueError: x=0.9 is too large (log: {log})"
    assert "ValueError: x=0.9 is too large" in open(log).read()  # the traceback is there
    assert results.best_config["x"] == 0.3


SCRIPT = """
import sys
sys.path.insert(0, {here!r})
import tune_jobs
from neural_arch import tune
tuner = tune.DistributedTuner(
    tune_jobs.curve, {{"x": tune.uniform(0.0, 1.0), "steps": {steps}, "sleep": 0.1}},
    num_samples=4, max_concurrent_trials=2, seed=1, local_dir={root!r}, study_name="resumed")
if __name__ == "__main__":
    tuner.tune()
"""


def trials_of(root):
    if not os.path.exists(os.path.join(root, "resumed", "study.journal")):
        return []
    storage = optuna.storages.JournalStorage(optuna.storages.journal.JournalFileBackend(
        os.path.join(root, "resumed", "study.journal")))
    try:
        return optuna.load_study(study_name="resumed", storage=storage).get_trials()
    except KeyError:  # not created yet
        return []


def worker_pids(root):
    found = []
    study = os.path.join(root, "resumed")
    for trial in sorted(os.listdir(study) if os.path.isdir(study) else []):
        folder = os.path.join(root, "resumed", trial)
        if os.path.isdir(folder):
            found += [int(open(os.path.join(folder, n)).read()) for n in os.listdir(folder)
                      if n.startswith("pid_")]
    return found


@pytest.mark.slow
def test_a_killed_tuner_resumes_its_study(tmp_path):
    script = tmp_path / "search.py"
    root = str(tmp_path / "runs")
    script.write_text(textwrap.dedent(SCRIPT.format(here=HERE, root=root, steps=15)))
    tuner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    try:  # kill it once one trial finished and another runs
        deadline = time.monotonic() + 60
        states = []
        while time.monotonic() < deadline:
            states = [t.state.name for t in trials_of(root)]
            if "COMPLETE" in states and "RUNNING" in states:
                break
            time.sleep(0.05)
        assert "COMPLETE" in states and "RUNNING" in states, states
        tuner.send_signal(signal.SIGKILL)
        tuner.wait(timeout=10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    before = {t.number: t for t in trials_of(root)}
    orphans = worker_pids(root)
    deadline = time.monotonic() + 15  # the launchers' guards stop the trials' processes
    while any(alive(pid) for pid in orphans) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in orphans)

    results = tune.DistributedTuner(
        tune_jobs.curve, {"x": tune.uniform(0.0, 1.0), "steps": 15, "sleep": 0.1},
        num_samples=4, max_concurrent_trials=2, seed=1, local_dir=root,
        study_name="resumed").tune()
    rows = {row["trial"]: row for row in results}
    done_before = [n for n, t in before.items() if t.state.name == "COMPLETE"]
    # a trial whose processes finished just before the kill is recorded from its files
    cut_off = [n for n, t in before.items()
               if t.state.name == "RUNNING" and rows[n]["state"] != "COMPLETE"]
    for number in done_before:  # finished before the kill: kept, not run again
        assert rows[number]["state"] == "COMPLETE"
        assert rows[number]["loss"] == before[number].value
    retries = {row["retry_of"]: row for row in results if row["retry_of"] is not None}
    assert sorted(retries) == sorted(cut_off)
    for number in cut_off:  # cut off: failed as interrupted, its config run once more
        assert rows[number]["state"] == "FAIL" and "interrupted" in rows[number]["error"]
        if rows[number]["dir"] is not None:  # else cut off in Optuna's ask, before it ran
            assert retries[number]["config"] == rows[number]["config"]
        assert retries[number]["state"] == "COMPLETE"
    assert results.count("COMPLETE") == 4 and len(results) == 4 + len(cut_off)
    xs = [row["config"]["x"] for row in results if row["state"] == "COMPLETE"]
    assert len(set(xs)) == 4  # the resumed sampler draws no finished config again
    finished = [n for n in sorted(os.listdir(os.path.join(root, "resumed")))
                if os.path.exists(os.path.join(root, "resumed", n, "result.pickle"))]
    assert len(finished) == 4  # no trial ran to its end twice


def test_a_second_tuner_of_a_running_study_is_refused(tmp_path):
    folder = tmp_path / "curve"
    folder.mkdir()
    (folder / "tuner.lock").write_text(f"{os.uname().nodename} {os.getppid()}\n")
    tuner = tune.DistributedTuner(tune_jobs.curve, {"x": tune.uniform(0.0, 1.0)},
                                  local_dir=str(tmp_path))
    with pytest.raises(RuntimeError, match=rf"driven by another tuner \(host .*, pid "
                                           rf"{os.getppid()}\); one tuner at a time"):
        tuner.tune()
    (folder / "tuner.lock").write_text(f"{os.uname().nodename} 999999999\n")  # gone: taken
    tuner = tune.DistributedTuner(tune_jobs.curve, {"x": tune.uniform(0.0, 1.0),
                                                    "steps": 1, "sleep": 0.0},
                                  num_samples=1, local_dir=str(tmp_path), verbose=False)
    assert tuner.tune().count("COMPLETE") == 1
    assert not (folder / "tuner.lock").exists()


def test_trials_left_running_are_recorded_if_they_finished_else_rerun(tmp_path):
    """As a tuner killed at the moment a trial's processes finished leaves it: running in the
    study, its result in its directory. The next tuner records it and reruns only the other."""
    import pickle
    from neural_arch.tune import study as studies
    from optuna.distributions import FloatDistribution
    folder = tmp_path / "curve"
    study = studies.open_study(studies.storage_for(None, str(folder)), "curve", "min", None,
                               studies.pruner_for(None))
    for number in (0, 1):  # both stay running, as a killed tuner left them
        trial = study.ask({"x": FloatDistribution(0.0, 1.0)})
        directory = folder / f"trial_{number:04d}"
        directory.mkdir()
        trial.set_user_attr("dir", str(directory))
        (directory / "reports.jsonl").write_text('{"step": 0, "values": {"loss": 9.0}}\n')
        if number == 0:  # this one's processes had finished
            (directory / "result.pickle").write_bytes(pickle.dumps({"loss": 0.25}))
    results = tune.DistributedTuner(
        tune_jobs.curve, {"x": tune.uniform(0.0, 1.0), "steps": 2, "sleep": 0.0},
        num_samples=2, local_dir=str(tmp_path)).tune()
    rows = results.trials
    assert [(r["trial"], r["state"], r["retry_of"]) for r in rows] == [
        (0, "COMPLETE", None), (1, "FAIL", None), (2, "COMPLETE", 1)]
    assert rows[0]["loss"] == 0.25 and rows[2]["config"] == rows[1]["config"]
    assert "interrupted" in rows[1]["error"] and "trial 2" in rows[1]["error"]


def test_ctrl_c_stops_the_running_trials_and_queues_them_again(tmp_path):
    root = str(tmp_path / "runs")
    script = tmp_path / "search.py"
    script.write_text(textwrap.dedent(SCRIPT.format(here=HERE, root=root, steps=100)))
    tuner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while len(worker_pids(root)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        workers = worker_pids(root)
        tuner.send_signal(signal.SIGINT)
        out, err = tuner.communicate(timeout=30)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    assert "KeyboardInterrupt" in err and "2 running trial(s) stopped and queued again" in out
    assert len(workers) == 2 and not any(alive(pid) for pid in workers)
    states = sorted((t.state.name, t.user_attrs.get("retry_of")) for t in trials_of(root))
    assert states == [("FAIL", None), ("FAIL", None), ("WAITING", 0), ("WAITING", 1)]
