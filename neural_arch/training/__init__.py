"""Training loops: ``Trainer`` (any model, any parallelism through its ``strategies``; with
``num_processes=N`` it starts its own workers), its ``TrainingConfig``, callbacks
(``EarlyStopping``, ``MLflowLogger``, ``TensorBoardLogger``) and the ``History`` that ``fit``
returns; ``fit_in_processes`` and ``PyTorchDDPTrainer`` (the launching of workers as a function,
and as one object) with its ``DistributedConfig``."""
from .callbacks import Callback, EarlyStopping, History
from .config import TrainingConfig
from .ddp_trainer import PyTorchDDPTrainer
from .distributed_config import DistributedConfig
from .launching import fit_in_processes
from .metrics import METRICS_FILE, MetricsLogger
from .mlflow_logger import MLflowLogger
from .tensorboard_logger import TensorBoardLogger
from .trainer import Trainer

__all__ = ["Callback", "DistributedConfig", "EarlyStopping", "History", "METRICS_FILE",
           "MetricsLogger", "MLflowLogger", "PyTorchDDPTrainer", "TensorBoardLogger", "Trainer",
           "TrainingConfig", "fit_in_processes"]
