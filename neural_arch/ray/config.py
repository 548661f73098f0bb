"""What a ``RayTrainer`` run asks for: ``ScalingConfig`` (how many workers, what each holds),
``RunConfig`` (where the run's checkpoints and reports go), ``CheckpointConfig`` (how many
checkpoints to keep) and ``FailureConfig`` (how many times to restart after a failure). The
names and defaults are Ray Train's, so a TorchTrainer script changes only its imports."""
from __future__ import annotations

import numbers
import os
from dataclasses import dataclass, field
from typing import Dict, Optional

DEFAULT_STORAGE = os.path.join("~", "ray_results")  # Ray Train's default, too
# Where runs without RunConfig.storage_path go, when set (read as each trainer is made): a
# process, or a test, moves them all at once without touching HOME.
STORAGE_VARIABLE = "NEURAL_ARCH_RAY_STORAGE"


def _count(name: str, value, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")


@dataclass
class ScalingConfig:
    """``num_workers`` Ray actors, each holding ``resources_per_worker`` (default one CPU, and
    one GPU with ``use_gpu``) for the whole run."""
    num_workers: int = 1
    resources_per_worker: Optional[Dict[str, float]] = None
    use_gpu: bool = False

    def __post_init__(self) -> None:
        _count("ScalingConfig.num_workers", self.num_workers, 1)
        for key, amount in (self.resources_per_worker or {}).items():
            if not isinstance(key, str) or isinstance(amount, bool) or \
                    not isinstance(amount, numbers.Real) or amount < 0:
                raise ValueError(f"ScalingConfig.resources_per_worker maps resource names to "
                                 f"amounts >= 0; got {key!r}: {amount!r}")

    def worker_resources(self) -> Dict[str, float]:
        """The resources one worker reserves (a placement-group bundle)."""
        resources = {"CPU": 1.0, **({"GPU": 1.0} if self.use_gpu else {})}
        resources.update({k: float(v) for k, v in (self.resources_per_worker or {}).items()})
        return {k: v for k, v in resources.items() if v > 0}


@dataclass
class CheckpointConfig:
    """``num_to_keep``: the newest registered checkpoints kept on storage (None: all)."""
    num_to_keep: Optional[int] = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None:
            _count("CheckpointConfig.num_to_keep", self.num_to_keep, 1)


@dataclass
class FailureConfig:
    """``max_failures``: how many failed attempts are restarted from the last checkpoint
    (-1: without limit)."""
    max_failures: int = 0

    def __post_init__(self) -> None:
        _count("FailureConfig.max_failures", self.max_failures, -1)


@dataclass
class RunConfig:
    """The run's folder is ``storage_path/name``; every worker and the driver must reach it
    (one machine, or a filesystem all nodes share): checkpoints and reports are written there.
    Without ``storage_path``: ``NEURAL_ARCH_RAY_STORAGE``, else ``~/ray_results``."""
    name: Optional[str] = None
    storage_path: Optional[str] = None
    checkpoint_config: CheckpointConfig = field(default_factory=CheckpointConfig)
    failure_config: FailureConfig = field(default_factory=FailureConfig)

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name
                                      or os.sep in self.name or self.name in (".", "..")):
            raise ValueError(f"RunConfig.name must be a folder name, got {self.name!r}")
        if self.checkpoint_config is None:
            self.checkpoint_config = CheckpointConfig()
        if self.failure_config is None:
            self.failure_config = FailureConfig()
