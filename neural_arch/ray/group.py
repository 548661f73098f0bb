"""The driver's side of one attempt: the workers' actors, their ranks, the job's variables, and
a teardown that leaves nothing behind.

The workers are placed as one placement group (every bundle or none, as Ray Train does), so a
cluster too small fails at once with what was asked, instead of starting some workers that wait
for the rest. Ranks follow the nodes (sorted by address, then Ray's node id), so that the
workers of a node have consecutive ranks; worker 0's node address and a port free there become
MASTER_ADDR and MASTER_PORT. The backend is chosen as ``backend="auto"`` chooses it, with Ray's
nodes as the hosts: shared memory among the workers of one node, tcp across nodes.
"""
from __future__ import annotations

import os
import secrets
import signal
import time
from dataclasses import dataclass
from typing import Any, Dict, List

from ..distributed.processes import host_identity, process_stat
from .config import ScalingConfig
from .session import TrainContext
from .worker import TrainWorker

START_TIMEOUT_S = 60.0  # placement, actors started and described
STOP_GRACE_S = 3.0      # SIGTERM (the loop's exit hooks run) before Ray kills the actor
GONE_TIMEOUT_S = 15.0   # for a killed actor's process to end


@dataclass
class Member:
    rank: int
    actor: Any
    info: Dict[str, Any]
    local_rank: int
    local_world_size: int
    node_rank: int

    def describe(self) -> str:
        i = self.info
        return (f"worker rank {self.rank} (pid {i['pid']} on {i['hostname']}, Ray node "
                f"{i['node_ip']} {i['node_id'][:8]})")

    def alive_here(self) -> bool:
        """Whether this worker's process runs on this host and is still alive."""
        if self.info["host"] != host_identity("pid"):
            return False
        stat = process_stat(self.info["pid"])
        return stat is not None and stat[0] not in (b"Z", b"X") and \
            stat[1] == self.info["start_time"]


class WorkerGroup:
    def __init__(self, ray: Any, scaling: ScalingConfig, tag: str,
                 start_timeout: float = START_TIMEOUT_S) -> None:
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
        self.ray, self.members = ray, []
        self._actors: List[Any] = []
        resources = scaling.worker_resources()
        n = scaling.num_workers
        self.pg = placement_group([dict(resources)] * n, strategy="PACK")
        try:
            if not self.pg.wait(timeout_seconds=start_timeout):
                raise RuntimeError(
                    f"RayTrainer: the cluster could not place {n} workers of {resources} each "
                    f"within {start_timeout:g} s; it has {ray.cluster_resources()} in all, "
                    f"{ray.available_resources()} free")
            remote = ray.remote(TrainWorker)
            custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU")}
            for i in range(n):
                self._actors.append(remote.options(
                    num_cpus=resources.get("CPU", 0), num_gpus=resources.get("GPU", 0),
                    resources=custom, max_restarts=0, name=f"{tag}-{i}",
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self.pg, placement_group_bundle_index=i)).remote())
            infos = ray.get([a.describe.remote() for a in self._actors], timeout=start_timeout)
            self._rank(infos)
        except BaseException:
            self.shutdown(graceful=False)
            raise

    def _rank(self, infos: List[Dict[str, Any]]) -> None:
        order = sorted(range(len(infos)), key=lambda i: (infos[i]["node_ip"],
                                                         infos[i]["node_id"], i))
        nodes = list(dict.fromkeys(infos[i]["node_id"] for i in order))
        for rank, i in enumerate(order):
            node = infos[i]["node_id"]
            same = [j for j in order if infos[j]["node_id"] == node]
            self.members.append(Member(rank, self._actors[i], infos[i], same.index(i), len(same),
                                       nodes.index(node)))
        self.nodes = len(nodes)

    def environment(self, start_timeout: float = START_TIMEOUT_S) -> List[Dict[str, str]]:
        """Each rank's variables for ``init_process_group``, with a secret of this attempt's."""
        master = self.members[0]
        address = master.info["node_ip"]
        port = self.ray.get(master.actor.free_port.remote(address), timeout=start_timeout)
        common = {"MASTER_ADDR": address, "MASTER_PORT": str(port),
                  "WORLD_SIZE": str(len(self.members)),
                  "NEURAL_ARCH_SECRET": secrets.token_hex(32),
                  "NEURAL_ARCH_BACKEND": "tcp" if self.nodes > 1 else "auto"}
        return [dict(common, RANK=str(m.rank), LOCAL_RANK=str(m.local_rank),
                     LOCAL_WORLD_SIZE=str(m.local_world_size), GROUP_RANK=str(m.node_rank),
                     NODE_RANK=str(m.node_rank)) for m in self.members]

    def contexts(self, name: str, storage_path: str) -> List[TrainContext]:
        return [TrainContext(m.rank, len(self.members), m.local_rank, m.local_world_size,
                             m.node_rank, name, storage_path) for m in self.members]

    def shutdown(self, graceful: bool) -> None:
        """End every worker. ``graceful``: SIGTERM first to those on this host, so that a loop
        stopped mid-run unlinks its shared-memory segments and closes its group."""
        local = [m for m in self.members if m.alive_here()]
        if graceful and local:
            for m in local:
                _signal(m.info["pid"], signal.SIGTERM)
            _wait(lambda: not any(m.alive_here() for m in local), STOP_GRACE_S)
        for actor in self._actors:
            try:
                self.ray.kill(actor, no_restart=True)
            except Exception:  # already dead, or never started
                pass
        try:
            from ray.util.placement_group import remove_placement_group
            remove_placement_group(self.pg)
        except Exception:
            pass
        if not _wait(lambda: not any(m.alive_here() for m in local), GONE_TIMEOUT_S):
            for m in local:  # Ray did not end it: nothing may outlive the run
                if m.alive_here():
                    _signal(m.info["pid"], signal.SIGKILL)


def _signal(pid: int, signum: int) -> None:
    try:
        os.kill(pid, signum)
    except OSError:
        pass


def _wait(predicate, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while not predicate():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True
