"""The settings of ``PyTorchDDPTrainer`` that are more than a ``TrainingConfig`` field: a
``DistributedConfig`` merged into its keywords, the job's shape that config asks for (checked
on every rank once the job exists), DDP's ``find_unused_parameters`` and the TensorBoard
folder. Each refusal is a ValueError naming the field and the value."""
from __future__ import annotations

import os
from typing import Any, Dict, Mapping, Optional, Tuple

from ..distributed import get_distributed_info, transports
from .distributed_config import DistributedConfig
from .strategies import DataParallel

OWNER = "PyTorchDDPTrainer"
LAUNCHER = "python -m neural_arch.distributed.launcher"
# the engines DistributedConfig.backend names that this trainer does not run, and where they are
OTHER_ENGINES = {
    "horovod": "Horovod's is HorovodTrainer (neural_arch.training.HorovodTrainer), or "
               "`python -m neural_arch.cli train --backend horovod`",
    "ray": "Ray's is RayTrainer (neural_arch.ray.RayTrainer), or "
           "`python -m neural_arch.cli train --backend ray`",
    "tensorflow": "there is no TensorFlow engine here: TensorFlow/Keras models are not run by "
                  "this project",
}


class UnusedParametersDataParallel(DataParallel):
    """"ddp" whose gradient averaging lets parameters that took no part in the loss through
    (DDP's ``find_unused_parameters=True``: their gradient is zero on every rank)."""

    def setup(self, model: Any, optimizer: Any, config: Any, group: Any = None) -> None:
        super().setup(model, optimizer, config, group)
        self.wrapper.ddp.find_unused_parameters = True


def config_arguments(config: Any, arguments: Dict[str, Any], defaults: Mapping[str, Any],
                     settings: Dict[str, Any]) -> Tuple[Optional[str], Dict[str, int]]:
    """Merge ``config`` (a DistributedConfig) into the trainer's keyword ``arguments`` and its
    TrainingConfig ``settings``, in place; a keyword also given with another value than the
    config's is refused. Returns the config's checkpoint_dir and the job shape to check."""
    from .launching import under_launcher
    if not isinstance(config, DistributedConfig):
        raise TypeError(f"{OWNER}: config must be a DistributedConfig, got "
                        f"{type(config).__name__}")
    engine = config.backend
    if engine in OTHER_ENGINES:
        raise ValueError(f"DistributedConfig.backend={engine!r}: {OWNER} runs 'pytorch-ddp'; "
                         f"{OTHER_ENGINES[engine]}")
    reverse = {DistributedConfig.trainer_name(f): f for f in config.to_dict()}
    given = set(config.given)
    if given & {"num_nodes", "gpus_per_node"}:
        given.add("num_gpus")  # the product of the two
    for keyword, value in config.trainer_arguments().items():
        field = reverse[keyword]
        target = arguments if keyword in arguments else settings
        explicit = keyword in target and target[keyword] != defaults.get(keyword)
        if field not in given:
            continue  # left at its default: the trainer's own (the same, or its keyword's)
        if explicit and target[keyword] != value:
            raise ValueError(f"{OWNER}: {keyword}={target[keyword]!r} and config.{field}="
                             f"{value!r} both set it; give it in one place")
        target[keyword] = value
    transport = arguments["backend"]
    if transport == "nccl" and not transports.is_available("nccl"):
        raise ValueError(f"DistributedConfig.communication_backend={config.communication_backend!r}"
                         f": the nccl transport is not available here (it needs CUDA GPUs and "
                         f"CuPy); 'gloo' runs on the CPU (shared memory on one node, TCP across)")
    launched = under_launcher()
    if config.num_nodes > 1 and not launched:
        raise ValueError(
            f"DistributedConfig.num_nodes={config.num_nodes}: {OWNER} starts processes on this "
            f"machine only; start the script on each of the {config.num_nodes} nodes with "
            f"`{LAUNCHER} --nnodes {config.num_nodes} --nproc-per-node {config.gpus_per_node} "
            f"--node-rank K --master-addr HOST script.py` (or srun, or mpirun), and fit trains "
            f"on the job's ranks")
    processes = arguments["num_gpus"] or arguments["num_processes"] or 1
    if transport == "mpi" and not launched and processes > 1:
        raise ValueError(f"DistributedConfig.communication_backend='mpi': the MPI backend's "
                         f"ranks are started by mpirun (`mpirun -n {processes} python "
                         f"script.py`), where fit trains on them; {OWNER}'s own workers talk "
                         f"over 'gloo' (shared memory or TCP)")
    return config.checkpoint_dir, config.expected_layout()


def check_job_layout(layout: Mapping[str, int]) -> None:
    """On every rank of the running job: the world size, the ranks on this node and the node
    count must be those the DistributedConfig gave (ValueError naming the field otherwise)."""
    info = get_distributed_info()
    world, local = info["world_size"], info["local_world_size"]
    found = {"num_gpus": (world, f"{world} ranks"),
             "gpus_per_node": (local, f"{local} on this node"),
             "num_nodes": (world // max(local, 1), f"{world} ranks, {local} a node")}
    for name, expected in layout.items():
        actual, described = found[name]
        if actual != expected:
            raise ValueError(f"DistributedConfig.{name}={expected}, but the job that started "
                             f"this process has {described} ({info.get('launcher')} launcher); "
                             f"start it with that shape or change the config")


def check_unused_parameters(find_unused_parameters: Any, zero_stage: int) -> bool:
    if not isinstance(find_unused_parameters, bool):
        raise TypeError(f"{OWNER}: find_unused_parameters must be a bool, got "
                        f"{find_unused_parameters!r}")
    if find_unused_parameters and zero_stage != 0:
        raise ValueError(f"{OWNER}: find_unused_parameters=True is DDP's (zero_stage=0); "
                         f"with zero_stage={zero_stage} the gradients are sharded and every "
                         f"parameter must take part in the loss")
    return find_unused_parameters


def tensorboard_folder(tensorboard: Any, tensorboard_dir: Any,
                       metrics_dir: Optional[str]) -> Tuple[bool, Optional[str]]:
    """(whether to write TensorBoard event files, the folder given; None: torch's default)."""
    if tensorboard is not None and not isinstance(tensorboard, bool):
        raise TypeError(f"{OWNER}: tensorboard must be a bool, got {tensorboard!r}")
    if tensorboard is False and tensorboard_dir is not None:
        raise ValueError(f"{OWNER}: tensorboard=False but tensorboard_dir={tensorboard_dir!r}; "
                         f"drop one of them")
    wanted = bool(tensorboard) or tensorboard_dir is not None
    if wanted and tensorboard_dir is not None and metrics_dir is not None and (
            os.path.abspath(tensorboard_dir)
            == os.path.abspath(os.path.join(metrics_dir, "tensorboard"))):
        raise ValueError(f"{OWNER}: tensorboard_dir={tensorboard_dir!r} is metrics_dir's "
                         f"TensorBoard folder, which the metrics logger writes there already "
                         f"(with tensorboardX installed); choose another folder")
    if wanted:
        from .tensorboard_logger import require_tensorboardx
        require_tensorboardx(OWNER)
    return wanted, None if tensorboard_dir is None else str(tensorboard_dir)
