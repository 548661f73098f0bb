"""``neural_arch.nn.SyncBatchNorm``'s module: torch's path to ``SyncBatchNorm``.

The layer is ``neural_arch.distributed``'s own (its statistics need collectives). Like
``nn/parallel.py`` this is a door into ``distributed``: ``neural_arch.nn`` names the class but
imports this module only on first use, so ``import neural_arch.nn`` never loads
``distributed`` (``tests/test_import_rules.py`` checks it).
"""
from ..distributed.sync_batchnorm import SyncBatchNorm

__all__ = ["SyncBatchNorm"]
