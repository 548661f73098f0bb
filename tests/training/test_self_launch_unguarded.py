"""A script that trains at its top level, without ``if __name__ == "__main__":``, runs as
written under ``python script.py``: each worker runs the script's top level up to the training
call (the classes and functions defined above it are its ``__mp_main__``), then the recipe the
parent sent; what follows the call runs only in the parent. Rank 0's History is that of the
same script with the guard."""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

HERE = os.path.dirname(os.path.abspath(__file__))
pytestmark = pytest.mark.timeout(90)
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                      "MASTER_ADDR", "MASTER_PORT", "SLURM_PROCID", "SLURM_STEP_ID",
                      "OMPI_COMM_WORLD_RANK", "PMI_RANK")

HEADER = """\
import json
import sys

import neural_arch.functional as F
from neural_arch.core import manual_seed
from neural_arch.data import DataLoader
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig
from neural_arch.training.ddp_trainer import PyTorchDDPTrainer
from self_launch_job import problem


class MyModel(MLP):
    def __init__(self):
        super().__init__([6, 8, 2])


def my_loss(output, target):
    return F.cross_entropy(output, target)


print("top level runs", flush=True)
"""
DATA = """\
manual_seed(0)
train_set, val_set = problem()
train_loader = DataLoader(train_set, batch_size=4, shuffle=True)
val_loader = DataLoader(val_set, batch_size=8)
model = MyModel()
"""
TRAINERS = {
    "ddp": """\
trainer = PyTorchDDPTrainer(model=model, num_gpus=2, batch_size=4, epochs=1, loss_fn=my_loss,
                            verbose=False, progress_bar=False)
history = trainer.fit(train_loader, val_loader)
""",
    "trainer": """\
config = TrainingConfig(epochs=1, seed=5, verbose=False, progress_bar=False)
trainer = Trainer(model, SGD(model.parameters(), lr=0.1), my_loss, config, num_processes=2)
history = trainer.fit(train_loader, val_loader)
""",
}
AFTER = """\
print(f"Training time: {history.total_time:.2f}s", flush=True)
with open(sys.argv[1], "w") as handle:
    json.dump(history.epochs, handle)
"""


def run_script(path, out):
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (HERE, env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(path), str(out)], env=env, capture_output=True,
                          text=True, timeout=60)


def write_script(tmp_path, kind, guarded):
    body = DATA + TRAINERS[kind] + AFTER
    if guarded:
        body = 'if __name__ == "__main__":\n' + textwrap.indent(body, "    ")
    path = tmp_path / f"{kind}_{'guarded' if guarded else 'unguarded'}.py"
    path.write_text(HEADER + body)
    return path


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(TRAINERS))
def test_an_unguarded_script_trains_as_the_guarded_one(tmp_path, kind):
    runs = {}
    for guarded in (True, False):
        out = tmp_path / f"{kind}_{guarded}.json"
        result = run_script(write_script(tmp_path, kind, guarded), out)
        output = result.stdout + result.stderr
        assert result.returncode == 0, output[-4000:]
        # the print after fit runs once, in the parent
        assert output.count("Training time: ") == 1, output[-4000:]
        runs[guarded] = json.loads(out.read_text()), output
    (guarded_epochs, guarded_output), (epochs, output) = runs[True], runs[False]
    # the top level runs in the parent and, up to the fit call, once in each worker
    assert guarded_output.count("top level runs") == 3, guarded_output[-4000:]
    assert output.count("top level runs") == 3, output[-4000:]
    assert [r["epoch"] for r in epochs] == [1]
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose([r[key] for r in epochs], [r[key] for r in guarded_epochs],
                                   rtol=1e-6, err_msg=key)


def test_what_the_training_needs_must_be_defined_above_the_first_training_call(tmp_path):
    # each worker stops its import of the script at the first fit: a class defined after it,
    # used by a second self-launched fit, is named with the line the workers stopped at
    path = tmp_path / "two_fits.py"
    path.write_text(HEADER + DATA + TRAINERS["ddp"] + textwrap.dedent("""\
        class LaterModel(MLP):
            def __init__(self):
                super().__init__([6, 4, 2])


        again = PyTorchDDPTrainer(model=LaterModel(), num_gpus=2, batch_size=4, epochs=1,
                                  verbose=False, progress_bar=False)
        again.fit(train_loader)
        """))
    result = run_script(path, tmp_path / "unused.json")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    first_fit = (HEADER + DATA + TRAINERS["ddp"]).count("\n")
    assert (f"ran {path} only up to line {first_fit}, the first training call at its top level"
            in result.stderr), result.stderr[-3000:]
    assert "LaterModel" in result.stderr
