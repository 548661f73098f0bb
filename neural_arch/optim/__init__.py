"""Optimizers, learning-rate schedulers and gradient clipping."""
from . import lr_scheduler
from .adam import Adam, AdamW
from .clip_grad import clip_grad_norm_, clip_grad_value_
from .lr_scheduler import (CosineAnnealingLR, LambdaLR, LinearLR, LRScheduler, SequentialLR,
                           StepLR)
from .optimizer import Optimizer
from .sgd import SGD

__all__ = [
    "Optimizer", "SGD", "Adam", "AdamW", "lr_scheduler", "LRScheduler", "LambdaLR", "StepLR",
    "LinearLR", "CosineAnnealingLR", "SequentialLR", "clip_grad_norm_", "clip_grad_value_",
]
