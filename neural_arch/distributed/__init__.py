"""Distributed training: process groups, collectives, and the tools built on them.

Collectives and process-group functions follow PyTorch's ``torch.distributed``. Training tools
(``DistributedDataParallel``, ``DistributedSampler``, the launcher) are imported on first use,
so ``import neural_arch.distributed`` stays light.

Subsystems live in subpackages: ``group/`` (process groups and the world), ``ddp/`` (data
parallel training), ``checkpoint/``, ``launch/`` (the launcher's parts), ``rendezvous/`` (the
store, authentication, the launch environment) and ``health/`` (heartbeat, preemption). Their
modules used to sit at the top level; ``_moved`` keeps those old paths importable.
"""
from __future__ import annotations

from .._lazy import lazy_names

from . import _moved  # first: it installs the finder that keeps old module paths importable
from .collectives import (all_gather, all_gather_into_tensor, all_gather_object, all_reduce,
                          barrier, broadcast, broadcast_object_list, gather, gather_object, recv,
                          reduce, reduce_scatter, reduce_scatter_tensor, scatter, send)
from .errors import (AuthenticationError, CollectiveMismatchError, CollectiveTimeoutError,
                     DistributedError, PeerFailureError, RendezvousError)
from .collectives.point_to_point import P2POp, batch_isend_irecv, irecv, isend
from .group import (ProcessGroup, destroy_process_group, get_backend, get_distributed_info,
                    get_local_rank, get_rank, get_world_size, init_process_group, is_initialized,
                    new_group)
from .reduce_ops import ReduceOp
from .work import Work

_LAZY = {
    "DistributedDataParallel": ".ddp.data_parallel",
    "DistributedSampler": ".ddp.sampler",
    "DeviceMesh": ".device_mesh",
    "init_device_mesh": ".device_mesh",
    "launch_distributed_training": ".launch.supervisor",
    "DistributedLauncher": ".launch.supervisor",
}


__getattr__, __dir__ = lazy_names(__name__, _LAZY, _moved.import_moved)  # old paths too,
# as ``dist.process_group``


__all__ = [
    "AuthenticationError", "CollectiveMismatchError", "CollectiveTimeoutError", "DeviceMesh",
    "DistributedDataParallel", "DistributedError", "DistributedLauncher", "DistributedSampler",
    "P2POp", "PeerFailureError", "ProcessGroup", "ReduceOp", "RendezvousError", "Work",
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "barrier",
    "batch_isend_irecv", "broadcast", "broadcast_object_list", "destroy_process_group", "gather",
    "gather_object", "get_backend", "get_distributed_info", "get_local_rank", "get_rank",
    "get_world_size", "init_device_mesh", "init_process_group", "irecv", "is_initialized",
    "isend", "launch_distributed_training", "new_group", "recv", "reduce", "reduce_scatter",
    "reduce_scatter_tensor", "scatter", "send",
]
