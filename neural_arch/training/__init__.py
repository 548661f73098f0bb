"""Training loops: ``Trainer`` (any model, any parallelism through its ``strategies``; with
``num_processes=N`` it starts its own workers), its ``TrainingConfig``, callbacks
(``EarlyStopping``, ``MLflowLogger``) and the ``History`` that ``fit`` returns;
``fit_in_processes`` and ``PyTorchDDPTrainer`` (the launching of workers as a function, and as
one object)."""
from .callbacks import Callback, EarlyStopping, History
from .config import TrainingConfig
from .ddp_trainer import PyTorchDDPTrainer
from .launching import fit_in_processes
from .metrics import METRICS_FILE, MetricsLogger
from .mlflow_logger import MLflowLogger
from .trainer import Trainer

__all__ = ["Callback", "EarlyStopping", "History", "METRICS_FILE", "MetricsLogger",
           "MLflowLogger", "PyTorchDDPTrainer", "Trainer", "TrainingConfig", "fit_in_processes"]
