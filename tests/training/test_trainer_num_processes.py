"""``Trainer(..., num_processes=N)``: a Trainer that starts its own workers at ``fit`` when this
process is not yet a rank of a job, returns rank 0's History and its trained weights, and under
a job (a process group, a launcher's variables) is the plain Trainer."""
from __future__ import annotations

import numpy as np
import pytest

import neural_arch.functional as F
from neural_arch.distributed import destroy_process_group, init_process_group
from neural_arch.optim import SGD
from neural_arch.training import Trainer

import self_launch_job as job

pytestmark = pytest.mark.timeout(120)


def test_two_workers_equal_one_process_with_the_global_batch():
    model = job.small_model()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                      job.quiet_config(epochs=2), num_processes=2)
    history = trainer.fit(job.loader(4), job.loader(4, job.problem()[1], shuffle=False))
    reference_model = job.small_model()
    reference = Trainer(reference_model, SGD(reference_model.parameters(), lr=0.1),
                        F.cross_entropy, job.quiet_config(epochs=2)).fit(
        job.loader(8), job.loader(8, job.problem()[1], shuffle=False))
    assert trainer.history is history and len(history) == 2 and history.total_time > 0
    for key in ("train_loss", "val_loss", "val_accuracy"):
        np.testing.assert_allclose(history[key], reference[key], rtol=1e-5, err_msg=key)
    trained = model.state_dict()  # the parent's model is the trained one
    for name, value in reference_model.state_dict().items():
        np.testing.assert_allclose(trained[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
    assert any(not np.allclose(trained[n], v) for n, v in job.small_model().state_dict().items())


def test_a_failing_worker_is_named():
    model = job.small_model()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), job.DyingLoss("exit"),
                      job.quiet_config(), num_processes=2)
    with pytest.raises(RuntimeError, match=r"Trainer.fit: rank 1 of 2 failed with exit code 3"):
        trainer.fit(job.loader(4))


def test_an_unpicklable_loss_is_refused_before_any_worker_starts():
    model = job.small_model()
    trainer = Trainer(model, SGD(model.parameters(), lr=0.1), lambda out, y: out.sum(),
                      job.quiet_config(), num_processes=2)
    with pytest.raises(TypeError, match=r"Trainer: loss_fn .*cannot be pickled"):
        trainer.fit(job.loader(4))


def test_in_a_job_it_trains_here_and_bad_values_are_refused():
    init_process_group("shm", world_size=1, rank=0)
    try:
        model = job.small_model()
        trainer = Trainer(model, SGD(model.parameters(), lr=0.1), F.cross_entropy,
                          job.quiet_config(), num_processes=2)
        assert trainer.world == 1  # the existing job decides the world, nothing is started
        assert len(trainer.fit(job.loader(8))) == 1
    finally:
        destroy_process_group()
    model = job.small_model()
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="num_processes must be a positive integer"):
            Trainer(model, SGD(model.parameters(), lr=0.1), num_processes=bad)
    with pytest.raises(ValueError, match="group= and resume_group= belong to a job"):
        Trainer(model, SGD(model.parameters(), lr=0.1), num_processes=2, group=object())
