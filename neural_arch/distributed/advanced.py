"""Advanced data-parallel training: accumulation, clipping, mixed precision, loss scaling,
communication profiling, and (from ``checkpoint``) checkpointing and fault-tolerant resume.

This is the public face of those tools, gathered from where they live: ``ddp/advanced.py``
(the wrapper and its config), ``ddp/loss_scaler.py``, ``profiler.py`` and ``checkpoint/``.
The checkpoint names are imported on first use, so this module imports without them.
"""
from __future__ import annotations

import importlib
from typing import Any

from .ddp.advanced import AdvancedDistributedDataParallel, DistributedTrainingConfig
from .ddp.loss_scaler import LossScaler
from .profiler import (CommunicationProfiler, current_tracer, set_collective_tracer,
                       trace_collectives)

_LAZY = {"DistributedCheckpointManager": ".checkpoint",
         "setup_fault_tolerant_training": ".checkpoint"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        value = getattr(importlib.import_module(module, __package__), name)
    except ModuleNotFoundError as exc:
        if exc.name != f"{__package__}{module}":
            raise  # a dependency of that module is missing: say so, not "no attribute"
        raise AttributeError(f"{name} needs {__package__}{module}, which is not "
                             f"available") from exc
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = ["AdvancedDistributedDataParallel", "CommunicationProfiler", "DistributedTrainingConfig",
           "LossScaler", "current_tracer", "set_collective_tracer", "trace_collectives"]
__all__ += sorted(_LAZY)  # the checkpoint names, imported on first use
