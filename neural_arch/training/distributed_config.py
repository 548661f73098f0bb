"""``DistributedConfig``: a distributed run's settings in one object, for
``PyTorchDDPTrainer(model, config=config)``::

    config = DistributedConfig(num_gpus=8, num_nodes=2, gpus_per_node=4, batch_size=32,
                               epochs=100, communication_backend="nccl", mlflow_tracking=True,
                               tensorboard=True, log_every_n_steps=100)

Every field given becomes one of the trainer's settings (``trainer_arguments``; a field left
out keeps the trainer's own default, the same or equivalent): ``gradient_clipping``
is ``max_grad_norm``, ``communication_backend`` the workers' transport ("gloo" means shared
memory on one node and TCP across, as ``init_process_group("gloo")`` does), ``checkpoint_frequency``
the epochs between checkpoints, ``log_every_n_steps`` the logging interval, ``num_nodes`` and
``gpus_per_node`` the shape the job must have. ``backend`` names the engine, which for this
trainer is "pytorch-ddp"; the others are refused by it, naming their own trainer.

A name that is not a field is a ValueError naming it, when the object is made and when a field
is assigned later: a misspelt setting must never be dropped silently. So is a value that cannot
run (checked here), and one that would have no effect (checked by the trainer, which knows the
rest: ``checkpoint_frequency`` without a ``checkpoint_dir``). ``given`` holds the fields set
explicitly. What a field cannot find on this machine (an "nccl" without GPUs, two nodes without
a launcher) is refused when the trainer is made.
"""
from __future__ import annotations

import math
from typing import Any, Dict, FrozenSet

__all__ = ["DistributedConfig"]

ENGINES = ("pytorch-ddp", "ddp", "horovod", "ray", "tensorflow")
# communication_backend -> PyTorchDDPTrainer's backend (the launcher's --backend)
TRANSPORTS = {"gloo": "gloo", "nccl": "nccl", "mpi": "mpi", "shm": "shm", "tcp": "tcp",
              "auto": "auto"}
_DEFAULTS: Dict[str, Any] = {
    # resources: num_gpus is the number of processes (on the CPU when there is no GPU)
    "num_gpus": None,                  # None: num_nodes * gpus_per_node
    "num_nodes": 1,
    "gpus_per_node": None,             # None: num_gpus / num_nodes
    "backend": "pytorch-ddp",          # the engine: "pytorch-ddp" is PyTorchDDPTrainer's
    "batch_size": None,                # per process; None: the loader's own
    "epochs": 1,
    "learning_rate": 1e-3,
    "mixed_precision": False,          # float16 compute, float32 master weights
    "gradient_accumulation_steps": 1,
    "gradient_clipping": None,         # the global gradient 2-norm's cap (None: none)
    "communication_backend": "gloo",   # gloo (CPU), nccl (GPUs), mpi (under mpirun), shm, tcp
    "find_unused_parameters": False,
    "checkpoint_frequency": 1,         # epochs between checkpoints
    "checkpoint_dir": None,            # None: fit(checkpoint_dir=...) or no checkpoints
    "mlflow_tracking": False,
    "tensorboard": False,              # event files in runs/<date>_<host>, as torch writes
    "log_every_n_steps": 10,
}
# field -> PyTorchDDPTrainer keyword, where the names differ
_TRAINER_NAMES = {"gradient_clipping": "max_grad_norm", "communication_backend": "backend",
                  "checkpoint_frequency": "save_every_epochs"}
_LAYOUT = ("num_nodes", "gpus_per_node", "backend", "checkpoint_dir")  # not keywords


def _refuse(name: str, value: Any, why: str) -> ValueError:
    return ValueError(f"DistributedConfig.{name}={value!r}: {why}")


def _is_count(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, int) and value >= 1


class DistributedConfig:
    def __init__(self, **fields: Any) -> None:
        unknown = sorted(set(fields) - set(_DEFAULTS))
        if unknown:
            others = f" (nor {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else ""
            raise ValueError(f"DistributedConfig has no field {unknown[0]!r}{others}; its "
                             f"fields are {sorted(_DEFAULTS)}")
        values = dict(_DEFAULTS, **fields)
        object.__setattr__(self, "_given", set(fields))
        object.__setattr__(self, "_values", values)
        self._check()

    # ------------------------------------------------------------------ fields
    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values", {})
        if name in values:
            if name == "num_gpus" and values[name] is None:
                return values["num_nodes"] * (values["gpus_per_node"] or 1)
            if name == "gpus_per_node" and values[name] is None:
                return (values["num_gpus"] or values["num_nodes"]) // values["num_nodes"]
            return values[name]
        raise AttributeError(f"DistributedConfig has no field {name!r}")

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in _DEFAULTS:
            raise ValueError(f"DistributedConfig has no field {name!r}; its fields are "
                             f"{sorted(_DEFAULTS)}")
        before = dict(self._values)
        self._values[name] = value
        try:
            self._check()
        except ValueError:
            self._values.clear()
            self._values.update(before)
            raise
        self._given.add(name)

    @property
    def given(self) -> FrozenSet[str]:
        """The fields set explicitly (at construction or by assignment)."""
        return frozenset(self._given)

    def to_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in _DEFAULTS}

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict()

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={self._values[k]!r}" for k in _DEFAULTS if k in self._given)
        return f"DistributedConfig({shown})"

    # ------------------------------------------------------------------ what it becomes
    def trainer_arguments(self) -> Dict[str, Any]:
        """The ``PyTorchDDPTrainer`` keywords these fields set (the engine, the job's shape and
        ``checkpoint_dir`` are the trainer's own business: see ``PyTorchDDPTrainer``)."""
        arguments = {}
        for name in _DEFAULTS:
            if name in _LAYOUT:
                continue
            value = getattr(self, name)
            if name == "communication_backend":
                value = TRANSPORTS[value]
            arguments[_TRAINER_NAMES.get(name, name)] = value
        return arguments

    @staticmethod
    def trainer_name(field: str) -> str:
        """The trainer keyword a field becomes (its own name where they agree)."""
        return _TRAINER_NAMES.get(field, field)

    # ------------------------------------------------------------------ checks
    def _check(self) -> None:
        v = self._values
        for name in ("num_nodes", "gradient_accumulation_steps", "checkpoint_frequency",
                     "log_every_n_steps", "epochs"):
            if not _is_count(v[name]):
                raise _refuse(name, v[name], "must be a positive integer")
        for name in ("num_gpus", "gpus_per_node", "batch_size"):
            if v[name] is not None and not _is_count(v[name]):
                raise _refuse(name, v[name], "must be a positive integer or None")
        gpus, nodes, per_node = v["num_gpus"], v["num_nodes"], v["gpus_per_node"]
        if gpus is not None and per_node is not None and gpus != nodes * per_node:
            raise ValueError(f"DistributedConfig: num_gpus={gpus} is not num_nodes={nodes} x "
                             f"gpus_per_node={per_node} = {nodes * per_node}")
        if gpus is not None and per_node is None and gpus % nodes:
            raise ValueError(f"DistributedConfig: num_gpus={gpus} does not split evenly over "
                             f"num_nodes={nodes}; give gpus_per_node")
        if v["backend"] not in ENGINES:
            raise _refuse("backend", v["backend"], f"choose one of {list(ENGINES)}")
        if v["communication_backend"] not in TRANSPORTS:
            raise _refuse("communication_backend", v["communication_backend"],
                          f"choose one of {sorted(TRANSPORTS)}")
        rate = v["learning_rate"]
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not (
                math.isfinite(rate) and rate > 0):
            raise _refuse("learning_rate", rate, "must be a number > 0")
        clip = v["gradient_clipping"]
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float))
                                 or not (math.isfinite(clip) and clip > 0)):
            raise _refuse("gradient_clipping", clip, "must be a number > 0 or None")
        for name in ("mixed_precision", "find_unused_parameters", "mlflow_tracking",
                     "tensorboard"):
            if not isinstance(v[name], bool):
                raise _refuse(name, v[name], "must be True or False")
        folder = v["checkpoint_dir"]
        if folder is not None and (not isinstance(folder, str) or not folder):
            raise _refuse("checkpoint_dir", folder, "must be a folder path or None")

    def expected_layout(self) -> Dict[str, int]:
        """The job's shape a launcher must have started: the counts given explicitly
        (``num_gpus``: the world size, ``gpus_per_node``: the ranks on each node,
        ``num_nodes``: world size / ranks per node)."""
        return {name: self._values[name] for name in ("num_gpus", "gpus_per_node", "num_nodes")
                if name in self._given}
