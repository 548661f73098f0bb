"""A small Ray on this machine for the tuner's Ray tests: two CPUs, no dashboard, an 80 MB
object store, on 127.0.0.1. Its processes find the tests' modules (the trials import their
train functions by name), and it is shut down when its ``with`` block ends (a test's, or a
module's), so that nothing of it outlives that (the ``leftovers`` fixture checks each test)."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Iterator

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
OBJECT_STORE_BYTES = 80 * 1024 * 1024


def search_path() -> str:
    """PYTHONPATH for processes that import the tests' modules by name."""
    return os.pathsep.join([HERE, TESTS, ROOT] + [
        p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@contextlib.contextmanager
def small_ray(num_cpus: int = 2) -> Iterator[None]:
    import ray
    saved = dict(os.environ)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # loopback addresses only
    os.environ["PYTHONPATH"] = search_path()
    os.environ.pop("RAY_ADDRESS", None)
    try:
        ray.init(num_cpus=num_cpus, include_dashboard=False,
                 object_store_memory=OBJECT_STORE_BYTES, logging_level="WARNING",
                 log_to_driver=False)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield
    finally:
        ray.shutdown()


if HERE not in sys.path:
    sys.path.insert(0, HERE)
