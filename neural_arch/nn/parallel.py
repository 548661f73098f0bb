"""``neural_arch.nn.parallel``: torch's path to ``DistributedDataParallel``.

The class is ``neural_arch.distributed``'s own. It is looked up on first use, so that
``import neural_arch.nn.parallel`` stays light; ``neural_arch.nn`` itself never imports this
module (model code runs without ``distributed``; ``tests/test_import_rules.py`` checks both).
"""
from __future__ import annotations

from .._lazy import lazy_names

__getattr__, __dir__ = lazy_names(
    __name__, {"DistributedDataParallel": "neural_arch.distributed.ddp.data_parallel"})

__all__ = ["DistributedDataParallel"]
