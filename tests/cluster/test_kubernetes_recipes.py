"""The Kubernetes recipes put every rank in its place: for each pod a recipe would create, the
environment Kubernetes (and Kubeflow's training operator) would give it is built from the YAML,
the pod's command is followed as far as the rendezvous (the launcher's command line and the
workers it would start, or the script itself), and the resolver must give every process its
own rank, the whole world and rank 0's pod as the master.

No cluster is needed: what the operator sets is written out below from its source (its pytorch
``envvar.go`` and ``master.go``), so a recipe that relies on anything else fails here.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from repo_paths import REPO_ROOT

from neural_arch.distributed.launch.args import parse_launcher_args
from neural_arch.distributed.launch.config import LaunchConfig
from neural_arch.distributed.rendezvous.env import resolve

yaml = pytest.importorskip("yaml", reason="parsing the recipes needs PyYAML (the dev extra)")

RECIPES = REPO_ROOT / "recipes" / "kubernetes"
LAUNCHER = ["python", "-m", "neural_arch.distributed.launcher"]
A_SECRET = "0123456789abcdef0123456789abcdef"  # what secretKeyRef would read


def load(name: str) -> list[dict]:
    with open(RECIPES / name, encoding="utf-8") as f:
        return [doc for doc in yaml.safe_load_all(f) if doc]


def container_env(container: dict) -> dict[str, str]:
    """The env the container spec gives; a Secret's value stands in for secretKeyRef."""
    env = {}
    for var in container.get("env", []):
        if "value" in var:
            env[var["name"]] = str(var["value"])
        else:
            assert "secretKeyRef" in var["valueFrom"], f"{var['name']}: only Secrets are known"
            env[var["name"]] = A_SECRET
    return env


def operator_env(job: dict, replica_type: str, index: int) -> dict[str, str]:
    """What the training operator adds to a PyTorchJob pod's container (no elasticPolicy)."""
    specs, spec = job["spec"]["pytorchReplicaSpecs"], job["spec"]
    total = sum(s["replicas"] for s in specs.values())
    nproc = str(spec.get("nprocPerNode", "1"))
    master = specs["Master"]["template"]["spec"]["containers"]
    port = next(p["containerPort"] for c in master if c["name"] == "pytorch"
                for p in c.get("ports", []) if p["name"] == "pytorchjob-port")
    node_rank = index + (1 if replica_type == "Worker" else 0)
    addr = f"{job['metadata']['name']}-master-0"
    return {"PYTHONUNBUFFERED": "0", "MASTER_PORT": str(port), "PET_MASTER_PORT": str(port),
            "MASTER_ADDR": addr, "PET_MASTER_ADDR": addr,
            "WORLD_SIZE": str(total * (int(nproc) if nproc.isdigit() else 1)),
            "RANK": str(node_rank), "PET_NPROC_PER_NODE": nproc,
            "PET_NODE_RANK": str(node_rank), "PET_NNODES": str(total)}


def launcher_workers(command: list[str], pod_env: dict[str, str], monkeypatch) -> list[dict]:
    """The environments of the workers the launcher would start in a pod with ``pod_env``."""
    assert command[:3] == LAUNCHER, f"the pod should run the launcher, not {command}"
    monkeypatch.chdir(REPO_ROOT)  # the image's working directory: the project
    with monkeypatch.context() as m:
        for name in list(os.environ):
            m.delenv(name)
        for name, value in pod_env.items():
            m.setenv(name, value)
        args = parse_launcher_args(command[3:])
        config = LaunchConfig(args.script, args.nproc_per_node, args.nnodes, args.node_rank,
                              args.master_addr, args.master_port, args.backend,
                              args.script_args)
        job_env, _notes = config.job_environment()
        return [config.worker_environment(job_env, local, 0)
                for local in range(config.nproc_per_node)]


def test_pytorchjob_gives_every_process_its_rank(monkeypatch):
    (job,) = load("pytorchjob.yaml")
    assert (job["apiVersion"], job["kind"]) == ("kubeflow.org/v1", "PyTorchJob")
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert specs["Master"]["replicas"] == 1  # the operator's master address is pod 0's
    nodes = sum(s["replicas"] for s in specs.values())
    nproc = int(job["spec"]["nprocPerNode"])
    seen = []
    for replica_type, spec in specs.items():
        (container,) = spec["template"]["spec"]["containers"]
        assert container["name"] == "pytorch"  # the container the operator sets up
        for index in range(spec["replicas"]):
            pod_env = {**container_env(container), **operator_env(job, replica_type, index)}
            for worker in launcher_workers(container["command"], pod_env, monkeypatch):
                info = resolve(environ=worker)
                seen.append(info.rank)
                assert info.world_size == nodes * nproc
                assert (info.master_addr, info.master_port) == ("neural-forge-master-0", 23456)
                assert info.launcher == "env" and worker["NEURAL_ARCH_BACKEND"] == "tcp"
                assert worker["NEURAL_ARCH_SECRET"] == A_SECRET  # one secret, every pod
    assert sorted(seen) == list(range(nodes * nproc))


def test_indexed_job_gives_every_pod_its_rank():
    service, job = load("indexed-job.yaml")
    assert (service["kind"], job["kind"]) == ("Service", "Job")
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    name = job["metadata"]["name"]
    assert spec["completionMode"] == "Indexed"
    assert spec["parallelism"] == spec["completions"]  # all ranks must run at once
    # pod i is <job>-i.<subdomain>: rank 0's name must be the one MASTER_ADDR gives
    assert service["spec"]["clusterIP"] == "None"
    assert pod["subdomain"] == service["metadata"]["name"]
    assert service["spec"]["selector"] == {"job-name": name}
    (container,) = pod["containers"]
    env = container_env(container)
    assert env["MASTER_ADDR"] == f"{name}-0.{pod['subdomain']}"
    ranks = []
    for index in range(spec["completions"]):
        pod_env = {**env, "JOB_COMPLETION_INDEX": str(index), "HOSTNAME": f"{name}-{index}"}
        info = resolve(environ=pod_env)
        ranks.append(info.rank)
        assert (info.launcher, info.world_size) == ("k8s", spec["completions"])
        assert (info.master_addr, info.master_port) == (env["MASTER_ADDR"], 29500)
        assert (info.local_rank, info.local_world_size) == (0, 1)
    assert ranks == list(range(spec["completions"]))
    assert container["command"][:2] == ["python", "examples/train_distributed.py"]
    assert Path(REPO_ROOT, container["command"][1]).is_file()
