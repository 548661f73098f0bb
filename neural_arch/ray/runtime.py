"""Finding Ray: the installed package, and the cluster a run uses.

Embedded by default, as Ray Train is: without a running Ray in this process, ``ray.init()``
starts one on this machine (no dashboard, a small object store: the workers exchange little
through it; at least as many CPUs as the workers ask for, so that a run of more workers than
cores still fits). Ray gives its processes the address of the machine's network interface;
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported, keeps them on 127.0.0.1.
``address=``, or ``RAY_ADDRESS``, joins a running cluster instead (``ray://host:10001``
through Ray Client, ``host:6379`` from a node of the cluster).

Through Ray Client the driver runs elsewhere, and the cluster imports what the driver sends it
by module name (a function of ``__main__`` travels whole). ``check_importable`` asks the
cluster to import a training loop's module before any worker starts, so that a module only the
driver has fails the run at once, saying how to ship it, rather than as a broken connection.
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Callable, Dict, Optional

EMBEDDED_OBJECT_STORE_BYTES = 128 * 1024 * 1024
# Ray Client's server starts a server of its own for each connection, forking from a process
# that runs gRPC threads; now and then that child dies at start and the connection is refused
# ("Initialization failure from server"). A new connection gets a new child.
CLIENT_CONNECT_ATTEMPTS = 3


def require_ray() -> Any:
    """The ``ray`` module; an ImportError saying how to install it when it is missing."""
    try:
        import ray
    except ImportError as exc:
        raise ImportError(f"neural_arch.ray needs Ray ({exc}); install it with "
                          f"pip install 'neural-arch[ray]'") from exc
    return ray


def cluster_address(address: Optional[str] = None) -> Optional[str]:
    """The cluster a run joins: ``address``, else ``RAY_ADDRESS``; None for an embedded Ray."""
    return address or os.environ.get("RAY_ADDRESS") or None


def is_client_address(address: Optional[str]) -> bool:
    return address is not None and address.startswith("ray://")


def ensure_ray(address: Optional[str] = None, num_cpus: Optional[int] = None,
               runtime_env: Optional[Dict[str, Any]] = None) -> bool:
    """Make sure this process is connected to Ray; True when this call connected it (the caller
    then shuts it down when done). ``num_cpus``: the least an embedded instance offers;
    ``runtime_env``: Ray's, for the job a cluster runs for this process."""
    ray = require_ray()
    if ray.is_initialized():
        return False
    address = cluster_address(address)
    if address is not None:
        _join(ray, address, runtime_env)
        return True
    cpus = max(os.cpu_count() or 1, num_cpus or 1)
    ray.init(num_cpus=cpus, include_dashboard=False,
             object_store_memory=EMBEDDED_OBJECT_STORE_BYTES, logging_level="WARNING")
    return True


def _join(ray: Any, address: str, runtime_env: Optional[Dict[str, Any]]) -> None:
    attempts = CLIENT_CONNECT_ATTEMPTS if is_client_address(address) else 1
    for attempt in range(1, attempts + 1):
        try:
            ray.init(address=address, logging_level="WARNING", log_to_driver=True,
                     runtime_env=runtime_env)
            return
        except ConnectionAbortedError as exc:
            ray.shutdown()
            if attempt == attempts:
                raise
            last = (str(exc).strip().splitlines() or [""])[-1]
            print(f"Ray Client: {address} refused the connection ({last}); connecting again "
                  f"({attempt + 1}/{attempts})", file=sys.stderr, flush=True)


def through_client() -> bool:
    """Whether this process reaches Ray through Ray Client."""
    from ray.util.client import ray as client
    return client.is_connected()


def _import_error(module: str) -> Optional[str]:
    """On the cluster: why ``module`` cannot be imported there, or None."""
    try:
        importlib.import_module(module)
    except Exception as exc:  # what the cluster raises is the message, whatever its kind
        return f"{type(exc).__name__}: {exc}"
    return None


def _ship_path(module: str) -> str:
    """What ``runtime_env={"py_modules": [...]}`` ships for ``module``: its top package's
    folder, or the file of a module outside any package."""
    top = sys.modules.get(module.split(".")[0])
    path = getattr(top, "__file__", None) or module
    return os.path.dirname(path) if os.path.basename(path) == "__init__.py" else path


def check_importable(ray: Any, function: Callable, timeout: float) -> None:
    """Through Ray Client: a RuntimeError, saying how to ship it, when the cluster cannot import
    the module ``function`` comes from."""
    module = getattr(function, "__module__", None)
    if not through_client() or module in (None, "__main__"):
        return
    error = ray.get(ray.remote(num_cpus=0)(_import_error).remote(module), timeout=timeout)
    if error is None:
        return
    where = getattr(sys.modules.get(module), "__file__", None) or "not a file"
    raise RuntimeError(
        f"RayTrainer: the training loop {getattr(function, '__qualname__', function)!r} comes "
        f"from module {module!r} ({where}), which the Ray cluster cannot import ({error}); "
        f"through Ray Client the cluster runs only code it can import: ship the module with "
        f"ray.init(address, runtime_env={{'py_modules': [{_ship_path(module)!r}]}}) before "
        f"fit(), or install it on every node")
