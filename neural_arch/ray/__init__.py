"""Ray Train's ``TorchTrainer`` on Neural Forge: ``RayTrainer`` runs a training loop on Ray
actors that form one of our process groups.

    from neural_arch.ray import RayTrainer, ScalingConfig, report

    def train_loop(config):
        ...                      # Trainer(...).fit(...) joins the job by itself
        report({"loss": loss})

    result = RayTrainer(train_loop, scaling_config=ScalingConfig(num_workers=2)).fit()

Ray itself is imported only when ``fit`` runs (``pip install 'neural-arch[ray]'``). See
docs/ray.md.
"""
from __future__ import annotations

from .checkpoint import Checkpoint
from .config import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from .result import Result, TrainingFailedError
from .session import TrainContext, get_checkpoint, get_context, report
from .trainer import RayTrainer

__all__ = ["Checkpoint", "CheckpointConfig", "FailureConfig", "RayTrainer", "Result",
           "RunConfig", "ScalingConfig", "TrainContext", "TrainingFailedError",
           "get_checkpoint", "get_context", "report"]
