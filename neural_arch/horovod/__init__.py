"""Horovod's PyTorch API on Neural Forge's own collectives: ``import neural_arch.horovod as hvd``
where a script said ``import horovod.torch as hvd``.

Start the ranks with ``python -m neural_arch.horovod.run -np N python train.py`` (the
project's ``horovodrun``). See docs/horovod.md for what is supported and what raises.

- ``basics``: ``init``, ``shutdown``, ``rank``, ``size``, ``local_*``, ``cross_*``
- ``compression``: ``Average``, ``Sum``, ``Adasum`` (refused), ``Compression``
- ``ops``: ``allreduce``, ``allgather``, ``broadcast`` and their async/in-place forms
- ``state``: ``broadcast_parameters``, ``broadcast_optimizer_state``, object collectives
- ``optimizer``: ``DistributedOptimizer``
- ``rounds``: the agreement round in front of every operation, and ``join()``
- ``negotiation``: named operations, matched by name on every rank; ``handles``: ``Handle``
"""
from __future__ import annotations

from .basics import (cross_rank, cross_size, gloo_enabled, init, is_homogeneous, is_initialized,
                     local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
                     nccl_built, rank, shutdown, size)
from .compression import Adasum, Average, Compression, Sum
from .rounds import join
from .handles import Handle, poll, synchronize
from .ops import (allgather, allgather_async, allreduce, allreduce_, allreduce_async,
                  allreduce_async_, broadcast, broadcast_, broadcast_async, broadcast_async_)
from .optimizer import DistributedOptimizer
from .state import (allgather_object, broadcast_object, broadcast_optimizer_state,
                    broadcast_parameters)

# Horovod features this package does not have: a clear error instead of AttributeError.
_UNSUPPORTED = {
    "elastic": "elastic training (hvd.elastic) is not supported; restart failed jobs with the "
               "launcher's --max_restarts instead",
    "ProcessSet": "Horovod process sets (hvd.ProcessSet) are not supported; every operation "
                  "runs on all ranks",
    "add_process_set": "Horovod process sets are not supported; every operation runs on all "
                       "ranks",
    "remove_process_set": "Horovod process sets are not supported",
    "global_process_set": "Horovod process sets are not supported; operations run on all ranks",
    "alltoall": "hvd.alltoall is not supported",
    "alltoall_async": "hvd.alltoall_async is not supported",
    "reducescatter": "hvd.reducescatter is not supported; use "
                     "neural_arch.distributed.reduce_scatter",
    "grouped_allreduce": "hvd.grouped_allreduce is not supported; call hvd.allreduce_async per "
                         "tensor and synchronize the handles",
    "sparse_allreduce_async": "sparse all-reduce is not supported",
    "SyncBatchNorm": "hvd.SyncBatchNorm is not supported",
    "keras": "the Keras frontend (horovod.keras / horovod.tensorflow.keras) is not supported; "
             "only the PyTorch-style API is",
    "tensorflow": "the TensorFlow frontend (horovod.tensorflow) is not supported; only the "
                  "PyTorch-style API is",
    "mxnet": "the MXNet frontend is not supported",
    "spark": "horovod.spark is not supported",
    "ray": "horovod.ray is not supported",
}


def __getattr__(name: str):
    if name in _UNSUPPORTED:
        raise NotImplementedError(f"hvd.{name}: {_UNSUPPORTED[name]}")
    raise AttributeError(f"module 'neural_arch.horovod' has no attribute {name!r}")


__all__ = [
    "Adasum", "Average", "Compression", "DistributedOptimizer", "Handle", "Sum", "allgather",
    "allgather_async", "allgather_object", "allreduce", "allreduce_", "allreduce_async",
    "allreduce_async_", "broadcast", "broadcast_", "broadcast_async", "broadcast_async_",
    "broadcast_object", "broadcast_optimizer_state", "broadcast_parameters", "cross_rank",
    "cross_size", "gloo_enabled", "init", "is_homogeneous", "is_initialized", "join",
    "local_rank", "local_size", "mpi_built", "mpi_enabled", "mpi_threads_supported",
    "nccl_built", "poll", "rank", "shutdown", "size", "synchronize",
]
