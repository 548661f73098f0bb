"""``Trainer.resumed_from``: the checkpoint a resume loaded, as the loader chose it, and the line
``train_gpt --resume`` prints from it.

The newest checkpoint is damaged before each resume, so the one loaded is an older one: the
path must be the loader's choice, not a guess from the step count. A checkpoint's name does not
identify it by its step: a damaged checkpoint of the same step under a later epoch's name (as a
copy or an earlier run may leave) is passed over by the loader, and must not be named either."""
import os
import shutil
import sys

import pytest

from dist_harness import installed_backends, run_ranks
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
from repo_paths import TESTS_DIR
from train_gpt_support import MODEL, run, write_text

sys.path.insert(0, str(TESTS_DIR))
from resume_agreement_job import damage  # noqa: E402

pytestmark = pytest.mark.timeout(120)
BACKEND = "shm" if "shm" in installed_backends() else "tcp"


def train(rank, world_size, directory, max_steps, resume):
    """DDP over the ranks, a checkpoint every 2 steps; (resumed_from, steps) of this rank."""
    import neural_arch.functional as F
    from neural_arch.core import manual_seed
    from neural_arch.data import DataLoader
    from neural_arch.models import MLP
    from neural_arch.optim import SGD
    from neural_arch.training import Trainer, TrainingConfig
    from trainer_job import problem
    manual_seed(0)
    model = MLP([6, 8, 2])
    config = TrainingConfig(max_steps=max_steps, save_interval=2, resume=resume,
                            checkpoint_dir=directory, seed=5, verbose=False,
                            progress_bar=False)
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy, config,
                      strategy="ddp")
    before = trainer.resumed_from
    trainer.fit(DataLoader(problem()[0], batch_size=4, shuffle=True))
    return before, trainer.resumed_from, trainer.step


def test_the_trainer_names_the_checkpoint_it_loaded_not_the_newest(tmp_path):
    from neural_arch.distributed.checkpoint import format as fmt
    directory = str(tmp_path / "checkpoints")
    fresh = run_ranks(train, 2, BACKEND, args=(directory, 4, True))
    assert fresh == [(None, None, 4)] * 2  # nothing to resume from: None
    damage(os.path.join(directory, fmt.checkpoint_name(0, 4)))
    older = os.path.join(directory, fmt.checkpoint_name(0, 2))
    resumed = run_ranks(train, 2, BACKEND, args=(directory, 6, True))
    assert resumed == [(None, older, 6)] * 2, resumed


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    return write_text(tmp_path_factory.mktemp("data") / "text.txt")


def test_train_gpt_names_the_older_checkpoint_it_resumed_from(text, tmp_path):
    out = tmp_path / "run"
    run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 6, "--out-dir", out)
    checkpoints = out / "checkpoints"
    older, newest = checkpoints / "ckpt-e000000-s00000003", checkpoints / "ckpt-e000000-s00000006"
    damage(str(newest))
    # a damaged checkpoint of step 3 that sorts after every other: the loader passes it over
    same_step = checkpoints / "ckpt-e000009-s00000003"
    shutil.copytree(older, same_step)
    damage(str(same_step))
    resumed = run("--data", text, *MODEL, "--batch-size", 8, "--max-steps", 7, "--out-dir", out,
                  "--resume")
    lines = [line for line in resumed.stdout.splitlines() if line.startswith("resumed from")]
    assert lines == [f"resumed from {older} (step 3, epoch 1)"], resumed.stdout
