"""A real Ray cluster of two nodes on this machine, one per test module (``ray_cluster``).

Each node offers one CPU, so the two workers of a run land one on each node and talk tcp, as
across machines. The cluster stays small (no dashboard, an 80 MB object store) and lives on
loopback addresses: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported, Ray
takes 127.0.0.1 as this machine's address instead of the network interface's. The workers
import the loops of these tests by module name, so their search path gets the tests' folders.
"""
from __future__ import annotations

import os
import sys

import pytest

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.dirname(HERE)
ROOT = os.path.dirname(TESTS)
sys.path.insert(0, HERE)  # ray_jobs, whatever pytest's import mode
NODE = {"num_cpus": 1, "object_store_memory": 80 * 1024 * 1024, "node_ip_address": "127.0.0.1"}


def ray_env() -> dict:
    """The environment a process that starts or joins Ray in these tests gets."""
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["PYTHONPATH"] = os.pathsep.join([HERE, TESTS, ROOT] + [
        p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    return env


@pytest.fixture(scope="module")
def ray_cluster():
    """(the cluster, its address), this process connected as the driver; shut down after."""
    ray = pytest.importorskip("ray")
    from ray.cluster_utils import Cluster
    saved = dict(os.environ)
    os.environ.update(ray_env())  # the nodes' processes, and so the workers, inherit it
    try:
        cluster = Cluster(initialize_head=True,
                          head_node_args=dict(NODE, include_dashboard=False))
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
        cluster.connect()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield cluster, cluster.address
    finally:
        ray.shutdown()
        cluster.shutdown()


def live_workers_of(name: str) -> list:
    """The names of Ray actors still alive that belong to the run ``name``."""
    import ray
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"{name}-")]

