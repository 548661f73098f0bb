"""Strategies: how the ``Trainer``'s step runs in parallel (see ``base.Strategy``).

``Trainer(..., strategy=...)`` takes one of these names or a ``Strategy`` instance; without
one it chooses from ``TrainingConfig.zero_stage`` (0 "ddp", 1 "zero1", 2 and 3 "fsdp"), which
at one process is the plain step with nothing to average.
"""
from typing import Any, Dict, Type

from .base import StepOutcome, Strategy
from .data_parallel import DataParallel
from .fsdp import FullyShardedDataParallel
from .horovod import HorovodStrategy
from .pipeline import Pipeline
from .single import SingleProcess
from .tensor_parallel import TensorParallel
from .zero import ZeroOne

STRATEGIES: Dict[str, Type[Strategy]] = {
    cls.name: cls for cls in (SingleProcess, DataParallel, ZeroOne, FullyShardedDataParallel,
                              TensorParallel, Pipeline, HorovodStrategy)}
_BY_ZERO_STAGE = {0: "ddp", 1: "zero1", 2: "fsdp", 3: "fsdp"}


def resolve_strategy(strategy: Any, config: Any) -> Strategy:
    """The ``Strategy`` that ``strategy`` (None, a name, or an instance) names."""
    if strategy is None:
        strategy = _BY_ZERO_STAGE[config.zero_stage]
    if isinstance(strategy, str):
        if strategy not in STRATEGIES:
            raise ValueError(f"Trainer: unknown strategy {strategy!r}; choose one of "
                             f"{sorted(STRATEGIES)} or pass a Strategy instance")
        return STRATEGIES[strategy]()
    if isinstance(strategy, Strategy):
        return strategy
    raise TypeError(f"Trainer: strategy must be a name ({sorted(STRATEGIES)}), a Strategy or "
                    f"None, got {type(strategy).__name__}")


__all__ = ["DataParallel", "FullyShardedDataParallel", "HorovodStrategy", "Pipeline",
           "STRATEGIES", "SingleProcess", "StepOutcome", "Strategy", "TensorParallel",
           "ZeroOne", "resolve_strategy"]
