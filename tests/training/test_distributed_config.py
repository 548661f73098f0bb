"""``DistributedConfig``, the settings object of ``PyTorchDDPTrainer(model, config=...)``: the
seed's snippet as written (imports apart), what each field becomes, and the refusals (an
unknown name, a field that would have no effect, a value this machine cannot run), each a
ValueError naming the field. One process, but for DDP's unused parameters (2); the tracked runs are in tests/tracking."""
from __future__ import annotations

import numpy as np
import pytest

from neural_arch.core import manual_seed
from neural_arch.data import TensorDataset
from neural_arch.distributed import transports
from neural_arch.distributed.checkpoint.directory import CheckpointDirectory
from neural_arch.models import MLP
from neural_arch.training import DistributedConfig, PyTorchDDPTrainer
from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test
from distributed_config_jobs import HalfUsed

pytestmark = pytest.mark.timeout(60)


def the_seed_config():
    # ---- as in the seed
    config = DistributedConfig(
        # Resources
        num_gpus=8,
        num_nodes=2,
        gpus_per_node=4,

        # Backend
        backend="pytorch-ddp",  # or "horovod", "ray", "tensorflow"

        # Training
        batch_size=32,  # Per GPU
        epochs=100,
        learning_rate=0.001,

        # Optimization
        mixed_precision=True,  # FP16
        gradient_accumulation_steps=4,
        gradient_clipping=1.0,

        # Communication
        communication_backend="nccl",  # or "gloo", "mpi"
        find_unused_parameters=False,

        # Checkpointing
        checkpoint_frequency=10,  # Every 10 epochs
        checkpoint_dir="./checkpoints",

        # Monitoring
        mlflow_tracking=True,
        tensorboard=True,
        log_every_n_steps=100
    )
    # ----
    return config


def test_the_seed_snippet_maps_every_field_onto_the_trainer():
    config = the_seed_config()
    assert config.trainer_arguments() == {
        "num_gpus": 8, "batch_size": 32, "epochs": 100, "learning_rate": 0.001,
        "mixed_precision": True, "gradient_accumulation_steps": 4, "max_grad_norm": 1.0,
        "backend": "nccl", "find_unused_parameters": False, "save_every_epochs": 10,
        "mlflow_tracking": True, "tensorboard": True, "log_every_n_steps": 100}
    assert config.checkpoint_dir == "./checkpoints"
    assert (config.num_nodes, config.gpus_per_node) == (2, 4)


def test_the_seed_config_is_refused_here_naming_what_this_machine_cannot_run():
    if not transports.is_available("nccl"):
        with pytest.raises(ValueError, match=r"communication_backend='nccl'.*'gloo'"):
            PyTorchDDPTrainer(MLP([6, 8, 2]), config=the_seed_config())
    config = the_seed_config()
    config.communication_backend = "gloo"
    with pytest.raises(ValueError, match=r"num_nodes=2.*--nnodes 2 --nproc-per-node 4"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=config)


def test_an_unknown_field_is_a_value_error_naming_it():
    with pytest.raises(ValueError, match=r"no field 'num_gpu'.*num_gpus"):
        DistributedConfig(num_gpu=2)
    config = DistributedConfig()
    with pytest.raises(ValueError, match=r"no field 'tensorbord'"):
        config.tensorbord = True


@pytest.mark.parametrize("fields, message", [
    ({"num_gpus": 6, "num_nodes": 2, "gpus_per_node": 4}, r"num_gpus=6.*num_nodes=2.*"
                                                          r"gpus_per_node=4"),
    ({"num_gpus": 3, "num_nodes": 2}, r"num_gpus=3.*num_nodes=2"),
    ({"backend": "jax"}, r"backend='jax'"),
    ({"communication_backend": "ucc"}, r"communication_backend='ucc'"),
    ({"batch_size": 0}, r"batch_size=0"),
    ({"learning_rate": -1.0}, r"learning_rate=-1.0"),
    ({"gradient_clipping": 0.0}, r"gradient_clipping=0.0"),
    ({"checkpoint_frequency": 0}, r"checkpoint_frequency=0"),
    ({"mlflow_tracking": "yes"}, r"mlflow_tracking='yes'"),
])
def test_values_that_cannot_run_are_refused_naming_the_field(fields, message):
    with pytest.raises(ValueError, match=message):
        DistributedConfig(**fields)


@pytest.mark.parametrize("backend, trainer", [("horovod", "HorovodTrainer"),
                                              ("ray", "RayTrainer"),
                                              ("tensorflow", "TensorFlow")])
def test_another_engine_is_not_run_by_the_ddp_trainer(backend, trainer):
    with pytest.raises(ValueError, match=rf"backend='{backend}'.*{trainer}"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(backend=backend))


def test_a_setting_given_twice_is_refused_and_one_left_out_keeps_the_keyword():
    with pytest.raises(ValueError, match=r"epochs=5.*config\.epochs=3"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(epochs=3), epochs=5)
    with pytest.raises(ValueError, match=r"max_grad_norm=0.5.*config\.gradient_clipping=1.0"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(gradient_clipping=1.0),
                          max_grad_norm=0.5)
    trainer = PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(
        gradient_clipping=1.0, log_every_n_steps=4, checkpoint_frequency=3), epochs=5)
    assert (trainer.config.epochs, trainer.config.max_grad_norm, trainer.config.log_interval,
            trainer.config.save_every_epochs) == (5, 1.0, 4, 3)


def test_mpi_needs_ranks_that_mpirun_started():
    with pytest.raises(ValueError, match=r"communication_backend='mpi'.*mpirun -n 2"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(
            num_gpus=2, communication_backend="mpi"))


def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(16, 6)).astype(np.float32)
    return TensorDataset(x, (x[:, 0] > 0).astype(np.int64))


def test_checkpoint_frequency_without_a_checkpoint_dir_is_refused_at_fit(tmp_path):
    trainer = PyTorchDDPTrainer(MLP([6, 8, 2]),
                                config=DistributedConfig(checkpoint_frequency=2))
    with pytest.raises(ValueError, match=r"checkpoint_frequency=2 has no effect"):
        trainer.fit(data())
    # with one at fit, it does
    trainer.fit(data(), checkpoint_dir=str(tmp_path))
    with pytest.raises(ValueError, match=r"checkpoint_dir=.*config\.checkpoint_dir="):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=DistributedConfig(
            checkpoint_dir=str(tmp_path / "a"))).fit(data(), checkpoint_dir=str(tmp_path / "b"))


def test_checkpoints_are_kept_every_checkpoint_frequency_epochs_and_at_the_end(tmp_path):
    config = DistributedConfig(batch_size=8, epochs=5, checkpoint_frequency=2,
                               checkpoint_dir=str(tmp_path / "checkpoints"))
    trainer = PyTorchDDPTrainer(MLP([6, 8, 2]), config=config, verbose=False,
                                progress_bar=False, max_checkpoints=5)
    trainer.fit(data())  # 16 rows / 8: 2 steps an epoch
    kept = [path.rsplit("/", 1)[-1] for path in
            CheckpointDirectory(str(tmp_path / "checkpoints")).list()]
    assert kept == ["ckpt-e000002-s00000004", "ckpt-e000004-s00000008",
                    "ckpt-e000005-s00000010"], kept
    with pytest.raises(ValueError, match=r"save_every_epochs=2 has no effect beside "
                                         r"save_interval=5"):
        PyTorchDDPTrainer(MLP([6, 8, 2]), config=config, save_interval=5)


@pytest.mark.slow
def test_find_unused_parameters_lets_a_model_with_unused_layers_train():
    manual_seed(0)
    quiet = {"verbose": False, "progress_bar": False}
    with pytest.raises(RuntimeError, match=r"received no gradient.*find_unused_parameters=True"):
        PyTorchDDPTrainer(HalfUsed(), config=DistributedConfig(num_gpus=2, batch_size=4),
                          **quiet).fit(data())
    model = HalfUsed()
    before = model.unused.weight.array.copy()
    trainer = PyTorchDDPTrainer(model, config=DistributedConfig(
        num_gpus=2, batch_size=4, find_unused_parameters=True), **quiet)
    history = trainer.fit(data())
    assert len(history) == 1 and np.isfinite(history["train_loss"][0])
    np.testing.assert_array_equal(model.unused.weight.array, before)
    with pytest.raises(ValueError, match=r"find_unused_parameters=True.*zero_stage=2"):
        PyTorchDDPTrainer(HalfUsed(), config=DistributedConfig(find_unused_parameters=True),
                          zero_stage=2)
