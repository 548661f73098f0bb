"""The guide's ``DistributedConfig`` / ``TrainingConfig``: every field becomes a Trainer setting
or is refused, naming the field and why; nothing is passed over."""
from __future__ import annotations

import pytest

from neural_arch.distributed.comm_hooks import TopKState
from neural_arch.tabgpt.training import (DistributedConfig, TrainingConfig,
                                         setup_distributed_training)
from neural_arch.tabgpt.training.mapping import plan
from neural_arch.training.strategies import FullyShardedDataParallel, ZeroOne

import tabgpt_jobs as jobs

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def no_job(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)


def test_an_unknown_field_is_an_error_naming_it_when_made_and_when_assigned():
    with pytest.raises(TypeError, match=r"TrainingConfig has no field 'batch_sise'"):
        TrainingConfig(batch_sise=8)
    config = DistributedConfig()
    config.bucket_size_mb = 50  # a field: fine
    with pytest.raises(AttributeError, match=r"DistributedConfig has no field 'bucket_size'"):
        config.bucket_size = 50


@pytest.mark.parametrize("changes, field, why", [
    ({"use_model_parallel": True}, "use_model_parallel", "data parallel only"),
    ({"tensor_parallel_size": 2}, "tensor_parallel_size", "data parallel only"),
    ({"pipeline_parallel_size": 2}, "pipeline_parallel_size", "data parallel only"),
    ({"gradient_sync_frequency": 2}, "gradient_sync_frequency", "local SGD"),
    ({"compression_ratio": 0.5}, "compression_ratio", "no effect without"),
    ({"use_gradient_compression": True, "compression_ratio": 2.0}, "compression_ratio",
     r"in \(0, 1\]"),
    ({"use_gradient_compression": True, "zero_stage": 1}, "use_gradient_compression",
     "communication hook"),
    ({"checkpoint_frequency": 10}, "checkpoint_frequency", "without enable_fault_tolerance"),
    ({"backend": "carrier-pigeon"}, "backend", "choose one of"),
    ({"rank": 1, "world_size": 2}, "rank", "no job is running"),
    ({"use_data_parallel": False, "world_size": 2}, "use_data_parallel", "each train alone"),
    ({"find_unused_parameters": True, "zero_stage": 2}, "find_unused_parameters",
     "only DDP"),
    ({"zero_stage": 5}, "zero_stage", "0, 1, 2 or 3"),
])
def test_a_field_the_project_cannot_run_is_refused_by_name(no_job, changes, field, why):
    with pytest.raises(ValueError, match=rf"DistributedConfig\.{field}=.*{why}"):
        plan(TrainingConfig(), DistributedConfig(**changes))


@pytest.mark.parametrize("changes, field, why", [
    ({"lr_scheduler_type": "polynomial"}, "lr_scheduler_type", "choose one of"),
    ({"batch_size": 0}, "batch_size", "positive integer"),
    ({"resume_from_checkpoint": "runs/checkpoints/ckpt-e1-s500"}, "resume_from_checkpoint",
     "names one checkpoint"),
    ({"resume_from_checkpoint": "no/such/folder"}, "resume_from_checkpoint", "not a folder"),
])
def test_a_training_field_is_refused_by_name(no_job, changes, field, why):
    with pytest.raises(ValueError, match=rf"TrainingConfig\.{field}=.*{why}"):
        plan(TrainingConfig(**changes), DistributedConfig())


def test_save_steps_and_fault_tolerance_must_agree(no_job):
    with pytest.raises(ValueError, match=r"TrainingConfig.save_steps=5: contradicts "
                                         r"DistributedConfig.checkpoint_frequency=10"):
        plan(TrainingConfig(save_steps=5),
             DistributedConfig(enable_fault_tolerance=True, checkpoint_frequency=10))


def test_the_fields_become_the_trainers_settings(no_job, tmp_path):
    train = TrainingConfig(batch_size=8, gradient_accumulation_steps=2, learning_rate=1e-3,
                           weight_decay=0.01, num_epochs=3, warmup_steps=4,
                           lr_scheduler_type="cosine", max_grad_norm=1.0, save_steps=7,
                           save_total_limit=2, eval_steps=5, logging_steps=3,
                           dataloader_num_workers=0, dataloader_pin_memory=True,
                           output_dir=str(tmp_path), seed=3)
    dist = DistributedConfig(world_size=2, bucket_size_mb=50, gradient_sync_frequency=2,
                             use_gradient_compression=True, compression_ratio=0.25)
    made = plan(train, dist)
    config = made.trainer_config
    assert made.num_processes == 2 and made.backend == "auto" and made.batch_size == 8
    assert (config.epochs, config.gradient_accumulation_steps, config.lr_schedule,
            config.warmup_steps, config.max_grad_norm, config.save_interval,
            config.max_checkpoints, config.eval_interval, config.log_interval,
            config.seed) == (3, 2, "cosine", 4, 1.0, 7, 2, 5, 3, 3)
    assert config.checkpoint_dir == str(tmp_path / "checkpoints") and not config.resume
    assert config.metrics_dir == str(tmp_path)
    assert config.data_parallel().bucket_size_mb == 50
    assert made.strategy.compression_ratio == 0.25 and TopKState(0.25).ratio == 0.25
    assert made.loader_options == {"num_workers": 0, "pin_memory": True}
    assert (made.learning_rate, made.weight_decay) == (1e-3, 0.01)
    assert isinstance(plan(train, DistributedConfig(zero_stage=1)).strategy, ZeroOne)
    assert plan(train, DistributedConfig(zero_stage=2)).strategy.zero_stage == 2
    assert isinstance(plan(train, DistributedConfig(zero_stage=3)).strategy,
                      FullyShardedDataParallel)
    tolerant = plan(TrainingConfig(output_dir=str(tmp_path)),
                    DistributedConfig(enable_fault_tolerance=True, checkpoint_frequency=11))
    assert (tolerant.trainer_config.save_interval, tolerant.trainer_config.resume) == (11, True)


def test_a_bad_value_is_refused_before_any_data_is_read(no_job):
    train, _, config = jobs.wine()
    with pytest.raises(ValueError, match=r"gradient_sync_frequency=3"):
        setup_distributed_training(jobs.tiny_classifier(config), train, None, TrainingConfig(),
                                   DistributedConfig(gradient_sync_frequency=3))
    with pytest.raises(TypeError, match=r"train_dataset must be a TabularDataset"):
        setup_distributed_training(jobs.tiny_classifier(config), [1, 2, 3], None,
                                   TrainingConfig(), DistributedConfig())
