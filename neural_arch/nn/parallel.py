"""``neural_arch.nn.parallel``: torch's path to ``DistributedDataParallel``.

The class is ``neural_arch.distributed``'s own. It is looked up on first use, so that
``import neural_arch.nn.parallel`` stays light; ``neural_arch.nn`` itself never imports this
module (model code runs without ``distributed``; ``tests/test_import_rules.py`` checks both).
"""
from __future__ import annotations

import importlib
from typing import Any

def __getattr__(name: str) -> Any:
    if name == "DistributedDataParallel":
        module = importlib.import_module("neural_arch.distributed.ddp.data_parallel")
        value = module.DistributedDataParallel
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list:
    return sorted(set(globals()) | set(__all__))


__all__ = ["DistributedDataParallel"]
