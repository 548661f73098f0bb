"""Fully sharded data parallelism (ZeRO-3 / ZeRO-2), torch's ``torch.distributed.fsdp``.

``fully_sharded`` is the wrapper, ``wrap`` the policies that split a model into units,
``flat_param`` a unit's flat layout and gather buffer, ``unit`` one unit's collectives,
``schedule`` when they run around forward and backward, ``state`` full and sharded views,
``options`` the strategy and precision settings and ``grad_scaler`` loss scaling over shards.
"""
from __future__ import annotations

from ..._lazy import lazy_names

_LAZY = {
    "FullyShardedDataParallel": ".fully_sharded",
    "ShardingStrategy": ".options",
    "MixedPrecision": ".options",
    "FlatShard": ".state",
    "ShardedGradScaler": ".grad_scaler",
    "ModuleWrapPolicy": ".wrap",
    "transformer_auto_wrap_policy": ".wrap",
    "size_based_auto_wrap_policy": ".wrap",
}

__getattr__, __dir__ = lazy_names(__name__, _LAZY)

__all__ = sorted(_LAZY)
