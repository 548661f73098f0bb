"""Process groups: the job's world and the groups of ranks that run collectives together.

``world`` holds the job (``init_process_group``, ``new_group``, ``destroy_process_group`` and
the module-level state they share), ``process_group`` the ``ProcessGroup`` class a collective
runs on, ``subgroup_transport`` the transports of groups smaller than the world, and
``backend_choice`` how ``backend="auto"`` is decided.
"""
from __future__ import annotations

from .process_group import ProcessGroup
from .world import (destroy_process_group, get_backend, get_distributed_info, get_local_rank,
                    get_rank, get_world_size, init_process_group, is_initialized, new_group,
                    resolve_group)

__all__ = ["ProcessGroup", "destroy_process_group", "get_backend", "get_distributed_info",
           "get_local_rank", "get_rank", "get_world_size", "init_process_group",
           "is_initialized", "new_group", "resolve_group"]
