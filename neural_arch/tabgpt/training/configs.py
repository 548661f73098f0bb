"""``DistributedConfig`` and ``TrainingConfig``: the TabGPT guide's two settings objects.

Each is a fixed set of named fields with the guide's defaults. A name that is not a field is an
error naming it, when the object is made and when a field is assigned later
(``config.bucket_size_mb = 50`` is fine, ``config.bucket_size = 50`` is not): a misspelt
setting must never be dropped silently. Which fields were given explicitly is kept
(``given``), so that a setting which would have no effect (``compression_ratio`` without
``use_gradient_compression``) is refused rather than passed over. What each field becomes in
the ``Trainer`` is ``mapping``'s business; a value the project cannot run is refused there,
naming the field and why.
"""
from __future__ import annotations

from typing import Any, Dict, FrozenSet

__all__ = ["DistributedConfig", "TrainingConfig"]


class _Fields:
    """Keyword-only fields with defaults (``_DEFAULTS``); unknown names are errors."""

    _DEFAULTS: Dict[str, Any] = {}

    def __init__(self, **values: Any) -> None:
        unknown = sorted(set(values) - set(self._DEFAULTS))
        if unknown:
            others = f" (nor {', '.join(map(repr, unknown[1:]))})" if unknown[1:] else ""
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}{others}; its "
                            f"fields are {sorted(self._DEFAULTS)}")
        object.__setattr__(self, "_given", set(values))
        for name, default in self._DEFAULTS.items():
            object.__setattr__(self, name, values.get(name, default))

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._DEFAULTS:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}; its fields are "
                                 f"{sorted(self._DEFAULTS)}")
        self._given.add(name)
        object.__setattr__(self, name, value)

    @property
    def given(self) -> FrozenSet[str]:
        """The fields set explicitly (at construction or by assignment)."""
        return frozenset(self._given)

    def to_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in self._DEFAULTS}

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other.to_dict() == self.to_dict()

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in self._DEFAULTS if k in self._given)
        return f"{type(self).__name__}({shown})"


class DistributedConfig(_Fields):
    """How the ranks are set up and talk (the guide's fields; see docs/tabular.md for what
    each becomes). ``zero_stage`` is this project's: 0 DDP, 1 ZeRO-1, 2/3 FSDP."""

    _DEFAULTS = {
        "backend": "gloo",                 # gloo (CPU, chosen here), shm, tcp, mpi, nccl
        "world_size": None,                # None: the job's, or 1 outside a job
        "rank": None,                      # checked against the job's, when given
        "local_rank": None,
        "use_data_parallel": True,
        "find_unused_parameters": False,
        "use_model_parallel": False,
        "pipeline_parallel_size": 1,
        "tensor_parallel_size": 1,
        "gradient_sync_frequency": 1,
        "use_gradient_compression": False,
        "compression_ratio": 0.1,
        "bucket_size_mb": 25,
        "use_static_graph": False,
        "enable_fault_tolerance": False,
        "checkpoint_frequency": 1000,
        "monitor_communication": True,
        "log_communication_stats": False,
        "zero_stage": 0,
    }


class TrainingConfig(_Fields):
    """The optimisation and its bookkeeping (the guide's fields, plus the epochs, steps,
    output folder, seed and weight decay that any run needs)."""

    _DEFAULTS = {
        "batch_size": 32,                  # per process
        "gradient_accumulation_steps": 1,
        "learning_rate": 5e-4,
        "weight_decay": 0.0,
        "num_epochs": 1,
        "max_steps": None,
        "warmup_steps": 0,
        "lr_scheduler_type": "constant",   # constant, cosine, linear
        "max_grad_norm": None,
        "use_mixed_precision": False,
        "save_steps": None,                # None: no checkpoints
        "save_total_limit": 3,
        "resume_from_checkpoint": None,    # True, or a checkpoint folder written by a run
        "eval_steps": None,                # None: at each epoch's end
        "logging_steps": 10,
        "dataloader_num_workers": 0,
        "dataloader_pin_memory": False,
        "output_dir": "tabgpt_output",     # metrics.jsonl, checkpoints/, monitor statistics
        "seed": 42,                        # the shuffle of the training rows
    }
