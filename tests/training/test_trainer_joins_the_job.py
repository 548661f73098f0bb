"""A Trainer under the launcher joins the job's process group by itself: a script without
``init_process_group`` trains once over both ranks, not once per rank."""
import json
import os
import sys

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.data import DataLoader
from neural_arch.distributed import is_initialized
from neural_arch.models import MLP
from neural_arch.optim import SGD
from neural_arch.training import Trainer, TrainingConfig

from launcher_support import free_port, job  # noqa: F401  (job: the launcher fixture)
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from trainer_job import problem  # noqa: E402
from trainer_joins_job import train  # noqa: E402

pytestmark = pytest.mark.timeout(60)
JOINED = "Trainer: joined the job's process group"


def test_the_trainer_joins_the_launchers_job_without_init_process_group(job, tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    env = job.env(PYTHONPATH=os.pathsep.join([job.env()["PYTHONPATH"], HERE]))
    result = job.run("--nproc_per_node=2", f"--master_port={free_port()}",
                     os.path.join(HERE, "trainer_joins_job.py"), out, 8, env=env, timeout=50)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["world"] for r in ranks] == [2, 2], "each rank trained a world of its own"
    assert result.stdout.count(JOINED) == 1, result.stdout  # rank 0 says so, once
    # one job over both ranks (4 samples each) is the one-process run with 8 a step
    _, reference = train(str(tmp_path / "reference"), 8)
    for name, value in reference.items():
        for rank in ranks:
            np.testing.assert_allclose(rank["weights"][name], value, rtol=1e-5, atol=1e-7,
                                       err_msg=name)
    # rank 0 alone wrote the metrics: 2 interval lines, not two runs' lines mixed up
    kinds = [json.loads(line)["kind"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert kinds == ["train", "train"], kinds


def make_trainer(**kwargs):
    model = MLP([6, 8, 2])
    return Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                   TrainingConfig(verbose=False), **kwargs)


def test_a_job_it_cannot_join_is_an_error_naming_the_variables(monkeypatch):
    # rank 1 of 2 with nowhere to meet rank 0: never a world of one instead
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    for name in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match=r"RANK=1, WORLD_SIZE=2.*backend='tcp'.*MASTER_ADDR"):
        make_trainer(backend="tcp")
    assert not is_initialized()


def test_a_group_the_script_made_is_kept(one_rank_group):
    trainer = make_trainer()
    trainer.fit(DataLoader(problem()[0], batch_size=16))
    trainer.fit(DataLoader(problem()[0], batch_size=16))  # a second fit in the same group
    assert is_initialized()
