"""Fault-tolerant training under the real launcher: a preempted 2-rank job saves at one step
boundary and exits cleanly, a worker that dies is restarted from the last checkpoint, and in
every case the finished job's weights equal those of an uninterrupted run."""
from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import numpy as np
import pytest

from neural_arch.nn.serialization import load_state_dict_file
from repo_paths import TESTS_DIR

try:
    from launcher_support import LauncherJob, free_port, job, wait_until  # noqa: F401
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import LauncherJob, free_port, job, wait_until  # noqa: F401

pytestmark = pytest.mark.timeout(240)
SCRIPT = str(TESTS_DIR / "checkpoint_training_job.py")
STEPS, SAVE_EVERY = 12, 3


def _start(launcher_job: LauncherJob, *script_args: object, max_restarts: int = 0):
    return launcher_job.start(SCRIPT, "--nproc_per_node=2", "--backend=shm",
                              f"--master_port={free_port()}", f"--max_restarts={max_restarts}",
                              "--", "--out", launcher_job.out, "--steps", STEPS,
                              "--save_every", SAVE_EVERY, *script_args)


def _final_weights(out: Path) -> dict:
    return dict(load_state_dict_file(out / "final.safetensors"))


def _records(out: Path, pattern: str) -> list:
    return [json.loads(p.read_text()) for p in sorted(out.glob(pattern))]


def _assert_same_weights(actual: dict, expected: dict) -> None:
    assert actual.keys() == expected.keys()
    for name in expected:
        assert np.array_equal(actual[name], expected[name]), name


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> dict:
    launcher_job = LauncherJob(tmp_path_factory.mktemp("uninterrupted"))
    try:
        result = launcher_job.finish(_start(launcher_job), timeout=120)
        assert result.returncode == 0, result.stderr
        return _final_weights(launcher_job.out)
    finally:
        launcher_job.cleanup()


def _relaunch_and_check(launcher_job: LauncherJob, resume_from: int, expected: dict) -> None:
    result = launcher_job.finish(_start(launcher_job), timeout=120)
    assert result.returncode == 0, result.stderr
    starts = [r for r in _records(launcher_job.out, "start_rank*.json") if r["resumed"]]
    assert [r["start_step"] for r in starts] == [resume_from + 1] * 2
    _assert_same_weights(_final_weights(launcher_job.out), expected)


def _stopped_checkpoint(out: Path, step: int) -> Path:
    (path,) = (out / "checkpoints").glob(f"ckpt-e*-s{step:08d}")
    assert sorted(os.listdir(path)) == ["manifest.json", "meta.json", "model.safetensors",
                                        "optimizer.safetensors", "rank0.json", "rank1.json"]
    return path


def test_sigterm_to_the_launcher_saves_and_a_relaunch_resumes(job, uninterrupted):
    pause_at = 4  # rank 0 waits there until the signal has arrived, so it lands mid-run
    launcher = _start(job, "--pause_at", pause_at, "--pause_rank", 0)
    assert wait_until(lambda: (job.out / "paused_rank0.json").exists(), 90)
    launcher.send_signal(signal.SIGTERM)
    result = job.finish(launcher, timeout=60)
    # The launcher reports the signal it was stopped by; the workers left on their own.
    assert result.returncode == 128 + signal.SIGTERM, result.stderr
    assert "Traceback" not in result.stderr
    stopped = _records(job.out, "stopped_rank*.json")
    assert stopped == [{"step": pause_at, "signal": "SIGTERM"}] * 2
    assert not (job.out / "final.safetensors").exists()
    _stopped_checkpoint(job.out, pause_at)
    _relaunch_and_check(job, pause_at, uninterrupted)


def test_sigterm_to_one_worker_stops_both_cleanly(job, uninterrupted):
    pause_at = 6
    launcher = _start(job, "--pause_at", pause_at, "--pause_rank", 1)
    paused = job.out / "paused_rank1.json"
    assert wait_until(paused.exists, 90)
    os.kill(json.loads(paused.read_text())["pid"], signal.SIGTERM)
    result = job.finish(launcher, timeout=60)
    assert result.returncode == 0, result.stderr  # every worker exited with status 0
    stopped = _records(job.out, "stopped_rank*.json")
    assert stopped == [{"step": pause_at, "signal": None},
                       {"step": pause_at, "signal": "SIGTERM"}]
    meta = json.loads((_stopped_checkpoint(job.out, pause_at) / "meta.json").read_text())
    assert meta["step"] == pause_at and meta["world_size"] == 2
    _relaunch_and_check(job, pause_at, uninterrupted)


@pytest.mark.parametrize("how, exit_text", [("exit", "exit code 17"),
                                            ("kill", "signal SIGKILL (exit code 137)")])
def test_restarted_job_resumes_from_the_last_checkpoint(job, uninterrupted, how, exit_text):
    die_at = 7  # after the checkpoint of step 5: steps 6 and 7 are done twice
    result = job.finish(_start(job, "--die_at", die_at, "--die_rank", 1, "--die_how", how,
                               max_restarts=1), timeout=150)
    assert result.returncode == 0, result.stderr
    assert f"rank 1 failed with {exit_text}; restarting all 2 workers" in result.stderr
    starts = sorted((r["attempt"], r["start_step"], r["resumed"])
                    for r in _records(job.out, "start_rank*.json"))
    assert starts == [(0, 0, False), (0, 0, False), (1, 6, True), (1, 6, True)]
    _assert_same_weights(_final_weights(job.out), uninterrupted)
