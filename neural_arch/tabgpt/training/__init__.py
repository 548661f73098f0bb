"""``tabgpt.training``: the guide's configs, trainer, monitor and profiler over the project's
``Trainer`` and strategies (see docs/tabular.md for what each config field becomes)."""
from .configs import DistributedConfig, TrainingConfig
from .manager import (DataSharding, DistributedManager, GradientSynchronization, barrier,
                      get_rank, get_world_size, is_main_process)
from .monitor import STATISTICS_FILE, DistributedTrainingMonitor
from .profiler import CommunicationProfiler
from .trainer import DistributedTrainer, setup_distributed_training

__all__ = ["CommunicationProfiler", "DataSharding", "DistributedConfig", "DistributedManager",
           "DistributedTrainer", "DistributedTrainingMonitor", "GradientSynchronization",
           "STATISTICS_FILE", "TrainingConfig", "barrier", "get_rank", "get_world_size",
           "is_main_process", "setup_distributed_training"]
