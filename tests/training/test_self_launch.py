"""A trainer that launches itself: ``fit_in_processes`` and ``PyTorchDDPTrainer`` start their
worker processes, return rank 0's History, name a worker that fails (and stop the others,
leaving nothing behind), refuse what cannot be pickled before any process starts, and only
fit in place when a launcher already started this process."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from functools import partial

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.optim import SGD
from neural_arch.training import Trainer
from neural_arch.training.ddp_trainer import PyTorchDDPTrainer
from neural_arch.training.launching import fit, fit_in_processes, under_launcher

from gpu_testing import GPUS
from launcher_support import LAUNCHER
from leftovers import Leftovers

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import self_launch_job as job  # noqa: E402

pytestmark = pytest.mark.timeout(60)
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID",
                      "OMPI_COMM_WORLD_RANK", "PMI_RANK")


@pytest.fixture(autouse=True)
def leftovers(monkeypatch):
    for name in LAUNCHER_VARIABLES:  # this test process is no rank of any job
        monkeypatch.delenv(name, raising=False)
    watch = Leftovers()
    yield watch
    processes, segments = watch.check()
    watch.remove(processes, segments)
    assert (processes, segments) == ([], []), "left behind: processes, /dev/shm segments"


def script_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    return env


def run_seed(*prefix, out, tmp_path, script=os.path.join(HERE, "self_launch_seed.py")):
    return subprocess.run([*prefix, script, str(out), str(tmp_path / f"ckpt_{out.stem}")],
                          env=script_env(), capture_output=True, text=True, timeout=50)


@pytest.mark.slow
def test_the_seed_example_as_a_plain_script_trains_in_two_processes(tmp_path):
    alone = run_seed(sys.executable, out=tmp_path / "self.json", tmp_path=tmp_path)
    assert alone.returncode == 0, alone.stdout[-3000:] + alone.stderr[-3000:]
    assert alone.stdout.count("num_gpus=2 starts 2 processes on the CPU") == 1
    assert alone.stdout.count("no GPU here: num_gpus=2" if GPUS == 0 else
                              "a GPU is here, but this trainer runs its processes on the CPU") == 1
    assert "Final accuracy: " in alone.stdout
    result = json.loads((tmp_path / "self.json").read_text())
    assert result["total_time"] > 0 and 0.0 <= result["best_accuracy"] <= 1.0
    assert [r["epoch"] for r in result["epochs"]] == [1, 2]
    # the same script started by the launcher fits in place on each rank: rank 0's History and
    # weights are those the self-launched run brought back
    launched = run_seed(*LAUNCHER, "--nproc_per_node=2", "--standalone",
                        out=tmp_path / "launched.json", tmp_path=tmp_path)
    assert launched.returncode == 0, launched.stdout[-3000:] + launched.stderr[-3000:]
    reference = json.loads((tmp_path / "launched.json").read_text())
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose([r[key] for r in result["epochs"]],
                                   [r[key] for r in reference["epochs"]], rtol=1e-6, err_msg=key)
    for name, value in reference["weights"].items():
        np.testing.assert_allclose(result["weights"][name], value, rtol=1e-6, err_msg=name)
    initial = job.small_model().state_dict()  # and training did move them
    assert not all(np.allclose(result["weights"][name], value) for name, value in initial.items())


def test_two_processes_equal_one_process_with_the_global_batch():
    trainer = PyTorchDDPTrainer(job.small_model(), num_gpus=2, batch_size=4, optimizer="sgd",
                                learning_rate=0.1, epochs=2, seed=5, verbose=False,
                                progress_bar=False)
    history = trainer.fit(job.loader(16), job.loader(8, job.problem()[1], shuffle=False))
    model = job.small_model()
    reference = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                        job.quiet_config(epochs=2)).fit(
        job.loader(8), job.loader(8, job.problem()[1], shuffle=False))
    assert len(history) == 2 and history.total_time > 0
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(history[key], reference[key], rtol=1e-5, err_msg=key)
    for name, value in model.state_dict().items():  # the trained weights came back
        np.testing.assert_allclose(trainer.model.state_dict()[name], value, rtol=1e-5,
                                   atol=1e-7, err_msg=name)


def test_a_partial_of_the_trainer_is_a_recipe():
    # the shape of a Trainer that launches itself: its own arguments, pickled together (the
    # optimizer keeps the model's parameters), rebuilt in every worker
    model = job.small_model()
    recipe = partial(Trainer, model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                     job.quiet_config(epochs=2))
    history = fit_in_processes(recipe, job.loader(4), num_processes=2)
    reference = job.make_trainer().fit(job.loader(8), epochs=2)
    np.testing.assert_allclose(history["train_loss"], reference["train_loss"], rtol=1e-5)


def test_a_run_past_its_timeout_is_stopped(tmp_path):
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"2 workers ran past timeout=1.5 s; all stopped"):
        fit_in_processes(partial(job.make_sleeping_trainer, str(tmp_path)), job.loader(4),
                         num_processes=2, timeout=1.5)
    assert time.monotonic() - started < 15


def test_a_worker_that_raises_is_named_with_its_exception():
    with pytest.raises(RuntimeError, match=r"rank 1 of 2 failed with exit code 1: it raised "
                                           r"ValueError: no data shard for rank 1"):
        fit_in_processes(job.make_trainer_failing_on_rank_1, job.loader(4), num_processes=2)


@pytest.mark.parametrize("how, described", [("sigkill", r"signal SIGKILL \(exit code 137\)"),
                                            ("exit", r"exit code 3")])
def test_a_worker_that_dies_is_named_and_the_others_are_stopped(how, described):
    with pytest.raises(RuntimeError, match=rf"rank 1 of 2 failed with {described}"):
        fit_in_processes(partial(job.make_dying_trainer, how), job.loader(4), num_processes=2)
    # the leftovers fixture checks that no worker and no /dev/shm segment is left


@pytest.mark.parametrize("part, pattern", [
    ("loss_fn", r"loss_fn \(.*<lambda>\) cannot be pickled.*Can.t pickle"),
    ("model", r"model \(a .*<locals>\.Local\) cannot be pickled.*local object"),
])
def test_an_unpicklable_recipe_is_refused_before_any_process_starts(monkeypatch, part, pattern):
    def never(*args, **kwargs):
        raise AssertionError("a worker process was started")
    monkeypatch.setattr("neural_arch.training.ddp_trainer.run_in_processes", never)

    class Local(type(job.small_model())):
        pass
    model = Local([6, 8, 2]) if part == "model" else job.small_model()
    loss = (lambda out, target: F.cross_entropy(out, target)) if part == "loss_fn" else None
    trainer = PyTorchDDPTrainer(model, num_gpus=2, batch_size=4, loss_fn=loss)
    with pytest.raises(TypeError, match=pattern) as caught:
        trainer.fit(job.loader(4))
    assert "top level of a module" in str(caught.value)


def test_a_model_defined_in_an_interactive_main_is_refused_before_any_process_starts():
    # python -c stands for a notebook or a REPL: a __main__ that a worker cannot import
    code = textwrap.dedent("""\
        from self_launch_job import loader
        from neural_arch.models import MLP
        from neural_arch.training.ddp_trainer import PyTorchDDPTrainer

        class NotebookModel(MLP):
            pass

        PyTorchDDPTrainer(NotebookModel([6, 8, 2]), num_gpus=2, batch_size=4).fit(loader(4))
        """)
    result = subprocess.run([sys.executable, "-c", code], env=script_env(),
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert ("TypeError: PyTorchDDPTrainer: NotebookModel defined in the __main__ of an "
            "interactive session") in result.stderr, result.stderr
    assert "[rank" not in result.stdout + result.stderr  # no worker ever ran


def test_under_a_launcher_it_fits_in_this_process(monkeypatch, tmp_path):
    def never(*args, **kwargs):
        raise AssertionError("a worker process was started under a launcher")
    monkeypatch.setattr(fit, "run_in_processes", never)
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    history = fit_in_processes(job.make_trainer, job.loader(4), num_processes=2)
    assert len(history) == 1 and history.total_time > 0


@pytest.mark.parametrize("variables, launched", [
    ({}, False),
    ({"RANK": "0", "WORLD_SIZE": "2"}, True),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}, True),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, False),  # a batch script, not an srun task
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_STEP_ID": "0"}, True),
])
def test_what_counts_as_under_a_launcher(variables, launched):
    assert under_launcher(variables) is launched


def test_ctrl_c_in_the_parent_stops_the_workers(tmp_path):
    script = tmp_path / "interrupted.py"
    script.write_text(textwrap.dedent(f"""\
        from functools import partial
        from self_launch_job import loader, make_sleeping_trainer
        from neural_arch.training.launching import fit_in_processes

        if __name__ == "__main__":
            fit_in_processes(partial(make_sleeping_trainer, {str(tmp_path)!r}), loader(4),
                             num_processes=2)
        """))
    proc = subprocess.Popen([sys.executable, str(script)], env=script_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 30
    while len(list(tmp_path.glob("started_*"))) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=20)
    # Python ends on an uncaught KeyboardInterrupt by SIGINT, as the shell expects
    assert proc.returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt: fit_in_processes: interrupted; all 2 workers stopped" in err, err


def test_the_settings_reach_the_training_config():
    trainer = PyTorchDDPTrainer(job.small_model(), num_gpus=2, batch_size=4, epochs=3,
                                mixed_precision=True, gradient_accumulation_steps=2,
                                zero_stage=1, scaler_init_scale=1024.0,
                                scaler_growth_interval=7, max_grad_norm=1.0)
    step = trainer.config.data_parallel()
    assert (step.loss_scale, step.loss_scale_window, step.zero_stage) == (1024.0, 7, 1)
    assert (trainer.config.epochs, step.gradient_accumulation_steps, step.mixed_precision,
            step.max_grad_norm) == (3, 2, True, 1.0)
    with pytest.raises(TypeError, match=r"unknown setting\(s\) \['epoch'\]"):
        PyTorchDDPTrainer(job.small_model(), epoch=3)
    with pytest.raises(ValueError, match="num_gpus=2 and its alias num_processes=3 disagree"):
        PyTorchDDPTrainer(job.small_model(), num_gpus=2, num_processes=3)
