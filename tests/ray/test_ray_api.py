"""The parts of neural_arch.ray that need no cluster: the configurations' checks, Checkpoint,
the session functions outside a worker, and which reports count (every rank made them)."""
from __future__ import annotations

import pytest

from neural_arch.ray import (Checkpoint, CheckpointConfig, FailureConfig, RayTrainer, RunConfig,
                             ScalingConfig, get_checkpoint, get_context, report, storage)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("make, message", [
    (lambda: ScalingConfig(num_workers=0), "num_workers must be an integer >= 1, got 0"),
    (lambda: ScalingConfig(resources_per_worker={"CPU": -1}), "'CPU': -1"),
    (lambda: CheckpointConfig(num_to_keep=0), "num_to_keep must be an integer >= 1, got 0"),
    (lambda: FailureConfig(max_failures=-2), "max_failures must be an integer >= -1, got -2"),
    (lambda: RunConfig(name="a/b"), "RunConfig.name must be a folder name, got 'a/b'"),
])
def test_configurations_refuse_bad_values_naming_them(make, message):
    with pytest.raises(ValueError) as caught:
        make()
    assert message in str(caught.value)


def test_worker_resources_default_to_one_cpu_and_a_gpu_when_asked():
    assert ScalingConfig(2).worker_resources() == {"CPU": 1.0}
    assert ScalingConfig(2, use_gpu=True).worker_resources() == {"CPU": 1.0, "GPU": 1.0}
    assert ScalingConfig(2, {"CPU": 2, "memory": 0}).worker_resources() == {"CPU": 2.0}


def test_trainer_checks_its_arguments():
    with pytest.raises(TypeError, match="train_loop_per_worker must be a function"):
        RayTrainer(3)
    with pytest.raises(TypeError, match="scaling_config must be a ScalingConfig, got dict"):
        RayTrainer(print, scaling_config={"num_workers": 2})


def test_runs_go_to_the_storage_the_environment_names(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURAL_ARCH_RAY_STORAGE", str(tmp_path / "runs"))
    assert RayTrainer(print).storage_path == str(tmp_path / "runs")
    named = RunConfig(storage_path=str(tmp_path / "named"))
    assert RayTrainer(print, run_config=named).storage_path == str(tmp_path / "named")
    monkeypatch.delenv("NEURAL_ARCH_RAY_STORAGE")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert RayTrainer(print).storage_path == str(tmp_path / "ray_results")  # Ray Train's


def test_checkpoint_directory_round_trip(tmp_path):
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "w.txt").write_text("1")
    checkpoint = Checkpoint.from_directory(tmp_path / "state")
    with checkpoint.as_directory() as folder:
        assert folder == str(tmp_path / "state")
    copy = checkpoint.to_directory(tmp_path / "copy")
    assert (tmp_path / "copy" / "w.txt").read_text() == "1" and copy == str(tmp_path / "copy")
    with pytest.raises(ValueError, match="is not a directory"):
        Checkpoint.from_directory(tmp_path / "missing")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        with Checkpoint(tmp_path / "gone").as_directory():
            pass


@pytest.mark.parametrize("call", [lambda: report({}), get_context, get_checkpoint])
def test_session_functions_outside_a_worker_say_so(call):
    with pytest.raises(RuntimeError, match="only inside a training loop that RayTrainer.fit"):
        call()


def test_a_report_counts_once_every_rank_made_it(tmp_path):
    run = str(tmp_path)
    storage.write_record(run, 0, 0, {"loss": 2.0}, True)
    storage.write_record(run, 0, 1, {"loss": 9.0}, False)
    storage.write_record(run, 1, 0, {"loss": 1.0}, True)  # rank 1 died before its report 1
    done = storage.complete_reports(run, 2)
    assert done == [storage.Report(0, {"loss": 2.0}, True)]
    assert storage.latest_checkpoint(done, run).endswith("checkpoint_000000")
    (tmp_path / "checkpoint_000001").mkdir()
    storage.drop_incomplete(run, 0)
    assert storage.ranks_that_reported(run) == {0: {0, 1}}
    assert not (tmp_path / "checkpoint_000001").exists()
