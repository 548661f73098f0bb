"""What ``AdvancedDistributedDataParallel`` runs in place of DDP for ZeRO-1 by reduce-scatter
(``reduce_scatter=True``, the ``"zero1"`` strategy): gradients stay local through backward,
and the window's sync is the optimizer's reduce-scatter of them
(``ReduceScatterZeroOptimizer.reduce_gradients``), each rank receiving the average of its own
shard; the optimizer's step all-gathers the updated shards.

It offers the part of DDP's interface the wrapper uses: calling it runs the module, and
``no_sync()``, ``sync_gradients()`` and ``comm_stats()``; like DDP it checks that the
replicas agree and starts every rank from the group's first rank's weights.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, Iterator, Optional

from ..replicas import broadcast_module_state, check_replicas_agree


class ReduceScatterSync:
    """See the module docstring. ``optimizer`` is set by ``wrap_optimizer``."""

    def __init__(self, module: Any, group: Any) -> None:
        check_replicas_agree(module, group, "ZeRO-1 (reduce-scatter)")
        broadcast_module_state(module, group)
        self.module, self.group = module, group
        self.optimizer: Optional[Any] = None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        yield  # nothing is averaged before the window's end anyway

    def sync_gradients(self) -> None:
        if self.optimizer is None:
            raise RuntimeError("ZeRO-1 by reduce-scatter averages the gradients through its "
                               "optimizer: build it with wrap_optimizer() before the first step")
        self.optimizer.reduce_gradients()

    def comm_stats(self) -> Dict[str, float]:
        return {"waited_s": 0.0, "hidden_s": 0.0, "syncs": 0}  # sync_gradients is timed whole
