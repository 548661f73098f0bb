"""Training loops: ``Trainer`` (any model, one process or data parallel), its
``TrainingConfig``, callbacks (``EarlyStopping``) and the ``History`` that ``fit`` returns."""
from .callbacks import Callback, EarlyStopping, History
from .config import TrainingConfig
from .metrics import METRICS_FILE, MetricsLogger
from .trainer import Trainer

__all__ = ["Callback", "EarlyStopping", "History", "METRICS_FILE", "MetricsLogger", "Trainer",
           "TrainingConfig"]
