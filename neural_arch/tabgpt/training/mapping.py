"""From the guide's two configs to the ``Trainer``'s settings: every field becomes a setting of
``neural_arch.training`` or is refused, naming the field and why; none is passed over.

``plan(training_config, distributed_config)`` returns a ``TrainingPlan``: the ``Trainer``'s
config, its strategy, its backend, the processes to start (or None: the job's ranks, or one),
the loaders' options and the optimiser's settings.
"""
from __future__ import annotations

import dataclasses
import os
import re
from typing import Any, Dict, Optional

from ...distributed import is_initialized
from ...distributed import get_rank, get_world_size
from ...distributed import transports
from ...training.config import TrainingConfig as TrainerConfig
from ...training.launching import under_launcher
from ...training.strategies import DataParallel, FullyShardedDataParallel, ZeroOne
from .configs import DistributedConfig, TrainingConfig

__all__ = ["TabularTrainerConfig", "TrainingPlan", "plan"]

_SCHEDULES = {"constant": "constant", "cosine": "cosine", "linear": "linear"}
_BACKENDS = {"gloo": "auto", "auto": "auto", "shm": "shm", "tcp": "tcp", "mpi": "mpi",
             "nccl": "nccl"}
_ONE_CHECKPOINT = re.compile(r"^ckpt-e\d+-s\d+$")


@dataclasses.dataclass
class TabularTrainerConfig(TrainerConfig):
    """The Trainer's config plus DDP's bucket size, which the guide sets per run."""

    bucket_size_mb: float = 25

    def data_parallel(self):  # the step's settings, with the bucket size
        return dataclasses.replace(super().data_parallel(), bucket_size_mb=self.bucket_size_mb)


class TabularDataParallel(DataParallel):
    """"ddp" with the guide's two DDP options: unused parameters allowed, a top-k compression
    hook (``TopKState(ratio)``), registered before the first backward."""

    def __init__(self, find_unused_parameters: bool = False,
                 compression_ratio: Optional[float] = None) -> None:
        super().__init__()
        self.find_unused_parameters = bool(find_unused_parameters)
        self.compression_ratio = compression_ratio

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        super().setup(model, optimizer, config, group)
        inner = self.wrapper.ddp
        inner.find_unused_parameters = self.find_unused_parameters
        if self.compression_ratio is not None:
            from ...distributed.comm_hooks import TopKState, topk_hook
            inner.register_comm_hook(TopKState(self.compression_ratio, group), topk_hook)


@dataclasses.dataclass
class TrainingPlan:
    trainer_config: TabularTrainerConfig
    strategy: Any
    backend: str
    num_processes: Optional[int]          # workers for train() to start; None: none
    batch_size: int
    loader_options: Dict[str, Any]
    learning_rate: float
    weight_decay: float


def _refuse(owner: str, name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"{owner}.{name}={value!r}: {why}")


def _positive_int(owner: str, name: str, value: Any, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _refuse(owner, name, value, "must be a positive integer")


def _job_world(dist: DistributedConfig) -> Optional[int]:
    """The processes train() starts (None: it trains in the job this process belongs to, or
    alone); refuses a world size, rank or local rank that contradicts the job."""
    _positive_int("DistributedConfig", "world_size", dist.world_size, allow_none=True)
    if under_launcher():
        if is_initialized():
            world, rank = get_world_size(), get_rank()
        else:
            from ...distributed.rendezvous.env import resolve
            info = resolve(master_needed=False)
            world, rank = info.world_size, info.rank
        local = os.environ.get("LOCAL_RANK")
        for name, ours in (("world_size", world), ("rank", rank),
                           ("local_rank", None if local is None else int(local))):
            value = getattr(dist, name)
            if value is not None and ours is not None and value != ours:
                raise _refuse("DistributedConfig", name, value,
                              f"this process belongs to a job whose {name} is {ours}")
        return None
    for name in ("rank", "local_rank"):
        value = getattr(dist, name)
        if value is None or (value == 0 and (dist.world_size or 1) == 1):
            continue
        raise _refuse("DistributedConfig", name, value,
                      "names this process's place in a job, but no job is running here (no "
                      "process group, no RANK/WORLD_SIZE from a launcher); leave it None and "
                      "train() starts world_size processes itself")
    return dist.world_size if (dist.world_size or 1) > 1 else None


def _strategy(dist: DistributedConfig, train: TrainingConfig, world: int) -> Any:
    owner = "DistributedConfig"
    if dist.use_model_parallel or dist.pipeline_parallel_size != 1 \
            or dist.tensor_parallel_size != 1:
        name = ("use_model_parallel" if dist.use_model_parallel else
                "pipeline_parallel_size" if dist.pipeline_parallel_size != 1 else
                "tensor_parallel_size")
        raise _refuse(owner, name, getattr(dist, name),
                      "model parallelism here is the GPT's (docs/tensor-parallel.md, "
                      "docs/pipeline-parallel.md); TabGPT trains data parallel only")
    if not dist.use_data_parallel and world > 1:
        raise _refuse(owner, "use_data_parallel", False,
                      f"{world} processes without data parallelism would each train alone; "
                      f"with model parallelism refused too, there is nothing else to run")
    if dist.zero_stage not in (0, 1, 2, 3):
        raise _refuse(owner, "zero_stage", dist.zero_stage, "must be 0, 1, 2 or 3")
    if dist.zero_stage and dist.find_unused_parameters:
        raise _refuse(owner, "find_unused_parameters", True,
                      f"only DDP (zero_stage=0) skips unused parameters; zero_stage is "
                      f"{dist.zero_stage}")
    ratio = None
    if dist.use_gradient_compression:
        if dist.zero_stage:
            raise _refuse(owner, "use_gradient_compression", True,
                          f"compression is a DDP communication hook; zero_stage "
                          f"{dist.zero_stage} reduces without DDP")
        if train.use_mixed_precision:
            raise _refuse(owner, "use_gradient_compression", True,
                          "mixed precision already compresses DDP's gradients to float16 "
                          "(one hook per DDP); set one of the two")
        ratio = dist.compression_ratio
        if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
            raise _refuse(owner, "compression_ratio", ratio,
                          "the share of each bucket's entries sent (top-k), in (0, 1]")
    elif "compression_ratio" in dist.given:
        raise _refuse(owner, "compression_ratio", dist.compression_ratio,
                      "has no effect without use_gradient_compression=True")
    if dist.zero_stage == 1:
        return ZeroOne()
    if dist.zero_stage in (2, 3):
        return FullyShardedDataParallel(dist.zero_stage)
    return TabularDataParallel(dist.find_unused_parameters, ratio)


def _checkpoints(dist: DistributedConfig, train: TrainingConfig) -> Dict[str, Any]:
    """checkpoint_dir, save_interval and resume, from save_steps, fault tolerance and
    resume_from_checkpoint."""
    folder = os.path.join(train.output_dir, "checkpoints")
    interval = train.save_steps
    _positive_int("TrainingConfig", "save_steps", interval, allow_none=True)
    resume = False
    if dist.enable_fault_tolerance:
        _positive_int("DistributedConfig", "checkpoint_frequency", dist.checkpoint_frequency)
        if interval is not None and interval != dist.checkpoint_frequency:
            raise _refuse("TrainingConfig", "save_steps", interval,
                          f"contradicts DistributedConfig.checkpoint_frequency="
                          f"{dist.checkpoint_frequency}; both set the steps between checkpoints")
        interval, resume = dist.checkpoint_frequency, True
    elif "checkpoint_frequency" in dist.given:
        raise _refuse("DistributedConfig", "checkpoint_frequency", dist.checkpoint_frequency,
                      "has no effect without enable_fault_tolerance=True (or use "
                      "TrainingConfig.save_steps)")
    source = train.resume_from_checkpoint
    if source not in (None, False):
        if source is not True:
            path = os.fspath(source)
            if _ONE_CHECKPOINT.match(os.path.basename(os.path.normpath(path))):
                raise _refuse("TrainingConfig", "resume_from_checkpoint", source,
                              f"names one checkpoint; a run resumes from the newest intact "
                              f"checkpoint of a folder: pass {os.path.dirname(path)!r}")
            if not os.path.isdir(path):
                raise _refuse("TrainingConfig", "resume_from_checkpoint", source,
                              "is not a folder of checkpoints")
            folder = path
        resume = True
    if interval is None and not resume:
        return {}
    return {"checkpoint_dir": folder, "save_interval": interval, "resume": resume}


def plan(train: TrainingConfig, dist: DistributedConfig) -> TrainingPlan:
    if not isinstance(train, TrainingConfig):
        raise TypeError(f"training_config must be a TrainingConfig, got {type(train).__name__}")
    if not isinstance(dist, DistributedConfig):
        raise TypeError(f"distributed_config must be a DistributedConfig, got "
                        f"{type(dist).__name__}")
    backend = _BACKENDS.get(str(dist.backend).lower())
    if backend is None:
        raise _refuse("DistributedConfig", "backend", dist.backend,
                      f"choose one of {sorted(_BACKENDS)}")
    if backend == "nccl" and not transports.is_available("nccl"):
        raise _refuse("DistributedConfig", "backend", dist.backend,
                      "the nccl transport is not available here (it needs CUDA GPUs and "
                      "CuPy); 'gloo' picks shared memory or TCP for the CPU")
    num_processes = _job_world(dist)
    world = num_processes or (get_world_size() if is_initialized() else dist.world_size or 1)
    strategy = _strategy(dist, train, world)
    for name in ("batch_size", "gradient_accumulation_steps", "num_epochs", "logging_steps",
                 "save_total_limit"):
        _positive_int("TrainingConfig", name, getattr(train, name))
    for name in ("max_steps", "eval_steps"):
        _positive_int("TrainingConfig", name, getattr(train, name), allow_none=True)
    sync = dist.gradient_sync_frequency
    _positive_int("DistributedConfig", "gradient_sync_frequency", sync)
    if sync not in (1, train.gradient_accumulation_steps):
        raise _refuse("DistributedConfig", "gradient_sync_frequency", sync,
                      f"ranks would step on gradients not averaged over the ranks (local SGD), "
                      f"which no strategy here runs; gradients are averaged once per "
                      f"accumulation window: set TrainingConfig.gradient_accumulation_steps="
                      f"{sync} to sync every {sync} micro-batches")
    schedule = _SCHEDULES.get(train.lr_scheduler_type)
    if schedule is None:
        raise _refuse("TrainingConfig", "lr_scheduler_type", train.lr_scheduler_type,
                      f"choose one of {sorted(_SCHEDULES)}")
    workers = train.dataloader_num_workers
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 0:
        raise _refuse("TrainingConfig", "dataloader_num_workers", workers,
                      "must be an integer >= 0")
    for name, value in (("learning_rate", train.learning_rate),
                        ("weight_decay", train.weight_decay)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0 or (
                name == "learning_rate" and value == 0):
            raise _refuse("TrainingConfig", name, value, "must be a number > 0 (weight_decay "
                          ">= 0)")
    try:
        config = TabularTrainerConfig(
            epochs=train.num_epochs, max_steps=train.max_steps,
            gradient_accumulation_steps=train.gradient_accumulation_steps,
            max_grad_norm=train.max_grad_norm, mixed_precision=bool(train.use_mixed_precision),
            zero_stage=dist.zero_stage, lr_schedule=schedule, warmup_steps=train.warmup_steps,
            seed=train.seed, log_interval=train.logging_steps, eval_interval=train.eval_steps,
            max_checkpoints=train.save_total_limit, metrics_dir=train.output_dir,
            progress_bar=False, bucket_size_mb=dist.bucket_size_mb,
            **_checkpoints(dist, train))
    except ValueError as exc:  # the Trainer's own check, in the guide's names where they differ
        raise ValueError(f"TrainingConfig/DistributedConfig: {exc}") from exc
    # use_static_graph needs nothing: DDP's buckets are fixed when it is built and launched in
    # one order every step, which is what the flag promises torch (either value is accepted)
    options = {"num_workers": workers, "pin_memory": bool(train.dataloader_pin_memory)}
    return TrainingPlan(config, strategy, backend, num_processes, train.batch_size, options,
                        float(train.learning_rate), float(train.weight_decay))
