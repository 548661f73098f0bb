"""A real Ray cluster of two nodes on this machine, one per test module (``ray_cluster``), and
one that takes Ray Client connections (``ray_client_cluster``); the runs the tests compare
(``trainer``, ``launcher_losses``) and the command line they run (``run_cli``).

Each node offers one CPU, so the two workers of a run land one on each node and talk tcp, as
across machines. The cluster stays small (no dashboard, an 80 MB object store) and lives on
loopback addresses: with ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0``, set before Ray is imported, Ray
takes 127.0.0.1 as this machine's address instead of the network interface's. The workers
import the loops of these tests by module name, so their search path gets the tests' folders.
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from leftovers import Leftovers

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


@pytest.fixture(scope="module")
def ray_client_cluster():
    """(the cluster, its Ray Client address ``ray://127.0.0.1:PORT``), this process not
    connected. The nodes do not get the tests' folders on their search path: as on a cluster
    elsewhere, the driver's modules reach them only if the driver ships them. Every process the
    cluster started (the client servers among them) must be gone once it is shut down."""
    pytest.importorskip("ray")
    pytest.importorskip("grpc", reason="Ray Client needs ray[client]")
    from ray.cluster_utils import Cluster
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    watch = Leftovers()
    saved = dict(os.environ)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # A connection whose server child dies at start (ensure_ray's retry) is refused only after
    # the proxy has waited this long for the child's channel; Ray's default is 30 s, and a
    # healthy child answers within about 2 s here.
    os.environ["RAY_CLIENT_SERVER_CHECK_CHANNEL_TIMEOUT_S"] = "10"
    try:
        cluster = Cluster(initialize_head=True, head_node_args=dict(
            NODE, include_dashboard=False, ray_client_server_port=port))
        cluster.add_node(**NODE)
        cluster.wait_for_nodes()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield cluster, f"ray://127.0.0.1:{port}"
    finally:
        cluster.shutdown()
        processes, segments = watch.check(limit=15.0)
        watch.remove(processes, segments)
        assert (processes, segments) == ([], []), "the cluster left processes or segments"


def live_workers_of(name: str) -> list:
    """The names of Ray actors still alive that belong to the run ``name``."""
    import ray
    return [a["name"] for a in ray.util.list_named_actors(all_namespaces=True)
            if a["name"].startswith(f"{name}-")]


def trainer(loop, tmp_path, name, workers=2, config=None, address=None, **run):
    """A RayTrainer of ``workers`` workers whose run folder is ``tmp_path/name``."""
    from neural_arch.ray import FailureConfig, RayTrainer, RunConfig, ScalingConfig
    return RayTrainer(loop, train_loop_config=config,
                      scaling_config=ScalingConfig(num_workers=workers),
                      run_config=RunConfig(name=name, storage_path=str(tmp_path),
                                           failure_config=FailureConfig(**run)),
                      address=address)


def launcher_losses(tmp_path):
    """The losses of ``ray_jobs.digits`` run as 2 ranks under our launcher."""
    out = tmp_path / "launcher.json"
    env = ray_env()
    env["NEURAL_ARCH_SECRET"] = "ray-test-secret-0123456789"
    done = subprocess.run([sys.executable, "-m", "neural_arch.distributed.launcher",
                           "--nproc-per-node", "2", os.path.join(HERE, "ray_jobs.py"), "--",
                           str(out)], env=env, capture_output=True, text=True, timeout=90)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(out.read_text())


CLI_SCRIPT = """\
import json, os, sys
import numpy as np
import neural_arch.distributed as dist
from neural_arch.ray import get_context
from beside import TAG
dist.init_process_group()
x = np.array([float(dist.get_rank() + 1)])
dist.all_reduce(x)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"world": dist.get_world_size(), "sum": float(x[0]), "argv": sys.argv,
               "backend": dist.get_backend(), "node": get_context().get_node_rank(),
               "main": __name__, "file": __file__, "cwd": os.getcwd(), "tag": TAG}, f)
dist.destroy_process_group()
"""


def run_cli(tmp_path, *extra):
    """``neural_arch.cli train --backend ray`` of 2 workers on ``tmp_path/job/train.py``, which
    imports a module beside it and writes what each rank saw; the run's folder goes to
    ``tmp_path/runs`` (``NEURAL_ARCH_RAY_STORAGE``). (records by rank, the script, the
    finished command), once every rank is seen to have joined the job."""
    job, out = tmp_path / "job", tmp_path / "out"
    job.mkdir()
    out.mkdir()
    (job / "train.py").write_text(CLI_SCRIPT)
    (job / "beside.py").write_text("TAG = 'beside'\n")
    env = ray_env()
    env["NEURAL_ARCH_RAY_STORAGE"] = str(tmp_path / "runs")
    done = subprocess.run([sys.executable, "-m", "neural_arch.cli", "train", "--script",
                           str(job / "train.py"), "--nproc", "2", "--backend", "ray", *extra,
                           "--", str(out), "--lr", "0.1"], env=env, capture_output=True,
                          text=True, timeout=100, cwd=tmp_path)
    assert done.returncode == 0, (done.stdout[-2000:], done.stderr[-3000:])
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for record in records:
        assert record["world"] == 2 and record["sum"] == 3.0, records
        assert record["argv"][1:] == [str(out), "--lr", "0.1"], record
        assert record["main"] == "__main__" and record["tag"] == "beside", record
    return records, str(job / "train.py"), done
