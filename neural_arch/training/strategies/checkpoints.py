"""What a strategy's ``checkpoints()`` returns when its state is a module, an optimizer and a
loss scaler: ``DistributedCheckpointManager`` behind the two calls the ``Trainer`` makes.

``save(epoch, step, loss, loop_state, scheduler, sampler)`` writes a checkpoint (collective
over the data group; its rank 0 writes) and returns its path; ``load(scheduler, sampler)``
restores the newest good one and returns the loop's state saved with it, or None when there
is no checkpoint to resume from; ``loaded_path`` then names the checkpoint it restored (None
before a load, or when there was none).
"""
from __future__ import annotations

from typing import Any, Dict, Optional

from ...distributed.checkpoint import DistributedCheckpointManager
from ...distributed.checkpoint.manager import NoCheckpointError


class ManagerCheckpoints:
    def __init__(self, directory: str, keep: int, module: Any, optimizer: Any, scaler: Any,
                 group: Any = None, resume_group: Any = None) -> None:
        self.manager = DistributedCheckpointManager(directory, keep, group=group,
                                                    resume_group=resume_group)
        self.module, self.optimizer, self.scaler = module, optimizer, scaler
        self.loaded_path: Optional[str] = None

    def save(self, epoch: int, step: int, loss: Optional[float], loop_state: Dict[str, Any],
             scheduler: Any = None, sampler: Any = None) -> str:
        return self.manager.save_checkpoint(
            self.module, self.optimizer, epoch, step, loss, additional_state=loop_state,
            scheduler=scheduler, loss_scaler=self.scaler, sampler=sampler)

    def load(self, scheduler: Any = None, sampler: Any = None) -> Optional[Dict[str, Any]]:
        try:
            info = self.manager.load_checkpoint(self.module, self.optimizer,
                                                scheduler=scheduler, loss_scaler=self.scaler,
                                                sampler=sampler)
        except NoCheckpointError:
            return None
        # the loader's choice: the newest intact one, which need not be the newest
        self.loaded_path = info["path"]
        return info["additional_state"]
