"""Row runners for the hyperparameter tuner (``neural_arch.tune.DistributedTuner``): a tuner
killed with SIGKILL mid-study and started again, and a trial that raises.

Each runner injects its fault once into fresh processes and returns a ``Run`` (``fault_rows``).
The train functions live here, at module level, so that the trials' processes import them.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from fault_rows import Run, alive, wait_for
from neural_arch.training.launching.worker import RESULT_FILE

SCRIPTS = Path(__file__).resolve().parent
SAMPLES, STEPS, STEP_S = 4, 15, 0.1   # each trial: about 1.5 s of reports
START_LIMIT_S = 60.0                  # for the killed tuner's first trial to finish


RAISING_X, RAISING_STEP = 0.2, 2     # the config that raises, and where


def curve(config):
    """Reports ``STEPS`` losses that depend on the config; ``finished`` marks a run to its end.
    The config ``x=RAISING_X`` leaves ``raised`` (the time) and raises at ``RAISING_STEP``."""
    from neural_arch import tune
    folder = tune.trial_dir()
    (Path(folder) / "pid").write_text(str(os.getpid()))
    for step in range(STEPS):
        if config["x"] == RAISING_X and step == RAISING_STEP:
            (Path(folder) / "raised").write_text(repr(time.time()))
            raise ValueError(f"trial {tune.trial_number()} raises at step {step}")
        tune.report(loss=(config["x"] - 0.3) ** 2 + 1.0 / (step + 1), step=step)
        time.sleep(STEP_S)
    (Path(folder) / "finished").write_text("")


def _tuner(root: Path, **extra):
    from neural_arch import tune
    return tune.DistributedTuner(curve, {"x": tune.uniform(0.0, 1.0)}, num_samples=SAMPLES,
                                 max_concurrent_trials=2, seed=1, local_dir=str(root),
                                 study_name="study", verbose=False, **extra)


_SCRIPT = """
import sys
sys.path[:0] = [{scripts!r}, {tests!r}]
import fault_rows_tune
if __name__ == "__main__":
    fault_rows_tune._tuner(fault_rows_tune.Path({root!r})).tune()
"""


def _states(root: Path) -> dict:
    """trial number -> state name, read from the study's journal (empty before it exists)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend
    journal = root / "study" / "study.journal"
    if not journal.exists():
        return {}
    storage = optuna.storages.JournalStorage(JournalFileBackend(str(journal)))
    try:
        trials = optuna.load_study(study_name="study", storage=storage).get_trials()
    except KeyError:
        return {}
    return {t.number: t.state.name for t in trials}


def _worker_pids(root: Path) -> list:
    return [int(p.read_text()) for p in (root / "study").glob("trial_*/pid")]


def killed_then_resumed(tmp: Path) -> Run:
    """A tuner (4 trials, 2 at a time) is SIGKILLed once a trial has finished while another
    runs, then started again on the same study. The time is from the kill until the killed
    tuner's trial processes are gone; the row passes when they are, and the resumed study
    kept every finished trial, ran each cut-off config once more, and ended with 4 finished."""
    root = tmp / "runs"
    script = tmp / "search.py"
    script.write_text(textwrap.dedent(_SCRIPT.format(scripts=str(SCRIPTS), root=str(root),
                                                     tests=str(SCRIPTS.parent / "tests"))))
    tuner = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    pids = [tuner.pid]
    try:
        ready = wait_for(lambda: {"COMPLETE", "RUNNING"} <= set(_states(root).values()),
                         START_LIMIT_S, [tuner])
        if not ready:
            return Run(None, False, f"no finished and running trials together (tuner exit "
                                    f"code {tuner.poll()}): {_states(root)}", pids)
        tuner.send_signal(signal.SIGKILL)
        start = time.perf_counter()
        tuner.wait(timeout=10)
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    workers = _worker_pids(root)
    pids += workers
    gone = wait_for(lambda: not any(alive(pid) for pid in workers), 30.0)
    seconds = time.perf_counter() - start
    before = _states(root)
    results = _tuner(root).tune()
    rows = {row["trial"]: row for row in results}
    kept = all(rows[n]["state"] == "COMPLETE" for n, s in before.items() if s == "COMPLETE")
    left_running = [n for n, s in before.items() if s == "RUNNING"]
    # a trial whose processes finished just before the kill is recorded from its files
    cut_off = sorted(n for n in left_running if rows[n]["state"] != "COMPLETE")
    retries = {row["retry_of"]: row for row in results if row["retry_of"] is not None}
    # (a trial cut off inside Optuna's ask, before it started, had no config yet)
    rerun_once = sorted(retries) == cut_off and all(
        (retries[n]["config"] == rows[n]["config"] or rows[n]["dir"] is None)
        and retries[n]["state"] == "COMPLETE" for n in cut_off)
    # and no config of a finished trial drawn again
    finished = [row["config"]["x"] for row in results if row["state"] == "COMPLETE"]
    rerun_once = rerun_once and len(finished) == len(set(finished))
    ran_to_end = len(list((root / "study").glob(f"trial_*/{RESULT_FILE}")))
    ok = (gone and kept and rerun_once and results.count("COMPLETE") == SAMPLES
          and ran_to_end == SAMPLES)
    done = sum(1 for s in before.values() if s == "COMPLETE")
    kept_text = "finished trials kept" if kept else "A FINISHED TRIAL WAS LOST"
    rerun_text = ("each cut-off config rerun once" if rerun_once
                  else "CUT-OFF CONFIGS NOT RERUN ONCE")
    return Run(seconds if gone else None, ok,
               f"killed with {done} trial(s) finished and {len(left_running)} running: the "
               f"{len(workers)} trial process(es) {'gone' if gone else 'STILL RUNNING'}; resumed: "
               f"{kept_text}, {rerun_text}, {results.count('COMPLETE')} of {SAMPLES} finished, "
               f"{ran_to_end} trial(s) ran to their end (one result each)", pids)


def trial_raises(tmp: Path) -> Run:
    """The second of 4 trials raises ValueError at its third step. The time is from the raise
    until the tuner recorded the trial as failed; the row passes when the error is recorded
    (the exception and the log) and the other 3 trials finished."""
    import optuna
    from optuna.storages.journal import JournalFileBackend
    points = [{"x": x} for x in (0.1, RAISING_X, 0.3, 0.4)]
    results = _tuner(tmp / "runs", points_to_evaluate=points).tune()
    failed = [row for row in results if row["state"] == "FAIL"]
    if len(failed) != 1:
        return Run(None, False, f"expected one failed trial, got states "
                                f"{[row['state'] for row in results]}")
    row = failed[0]
    raised = float((Path(row["dir"]) / "raised").read_text())
    storage = optuna.storages.JournalStorage(JournalFileBackend(
        str(tmp / "runs" / "study" / "study.journal")))
    trial = optuna.load_study(study_name="study", storage=storage).trials[row["trial"]]
    seconds = trial.datetime_complete.timestamp() - raised
    error = row["error"] or ""
    named = f"raised ValueError: trial 1 raises at step {RAISING_STEP}" in error \
        and "rank_0.log" in error
    ok = named and results.count("COMPLETE") == SAMPLES - 1
    return Run(seconds, ok, f"trial {row['trial']} recorded as failed with the error "
                            f"{'and its log' if named else 'MISSING: ' + error[:80]}; the "
                            f"other {results.count('COMPLETE')} trials finished")
