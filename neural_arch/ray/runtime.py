"""Finding Ray: the installed package, and the cluster a run uses.

Embedded by default, as Ray Train is: without a running Ray in this process, ``ray.init()``
starts one on this machine (no dashboard, a small object store: the workers exchange little
through it; at least as many CPUs as the workers ask for, so that a run of more workers than
cores still fits). Ray gives its processes the address of the machine's network interface;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported, keeps them on 127.0.0.1.
``address=``, or ``RAY_ADDRESS``, joins a running cluster instead (``ray://host:10001``
through Ray Client, ``host:6379`` from a node of the cluster).
"""
from __future__ import annotations

import os
from typing import Any, Optional

EMBEDDED_OBJECT_STORE_BYTES = 128 * 1024 * 1024


def require_ray() -> Any:
    """The ``ray`` module; an ImportError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"neural_arch.ray needs Ray ({exc}); install it with "
                          f"pip install 'neural-arch[ray]'") from exc
    return ray


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None) -> bool:
    """Make sure this process is connected to Ray; True when this call connected it (the caller
    then shuts it down when done). ``num_cpus``: the least an embedded instance offers."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS") or None
    if address is not None:
        ray.init(address=address, logging_level="WARNING", log_to_driver=True)
        return True
    cpus = max(os.cpu_count() or 1, num_cpus or 1)
    ray.init(num_cpus=cpus, include_dashboard=False,
             object_store_memory=EMBEDDED_OBJECT_STORE_BYTES, logging_level="WARNING")
    return True
