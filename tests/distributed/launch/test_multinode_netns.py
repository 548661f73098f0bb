"""Two real "nodes": network namespaces joined by a veth pair, one launcher in each.

A 4-rank all-reduce job (2 nodes x 2 ranks, tcp) started with ``--nnodes=2 --node_rank=K``
gives exact results; cutting the link mid-run makes every rank fail within 10 s with an error
naming a peer and the operation, and both launchers exit non-zero. Traffic stays inside the
namespaces (10.213.N.0/24 exists only there); they are deleted in ``finally``.
"""
from __future__ import annotations

import json
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np
import pytest

import fault_injection_job
from fault_injector import wait_for
from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(180)
JOB = fault_injection_job.__file__
DETECT_LIMIT_S = 10.0


def _ip(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)


def namespaces_unavailable() -> Optional[str]:
    """Why network namespaces cannot be made here, or None when they can."""
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    if shutil.which("ip") is None:
        return "the ip command (iproute2) is not installed"
    probe = f"nfprobe{secrets.token_hex(3)}"
    made = _ip("netns", "add", probe)
    _ip("netns", "del", probe)
    if made.returncode != 0:
        return f"cannot create a network namespace: {made.stderr.strip()}"
    return None


class NetnsPair:
    """Namespaces ``names[0]``/``names[1]`` at ``addrs[0]``/``addrs[1]`` over one veth pair."""

    def __init__(self) -> None:
        tag = secrets.token_hex(3)
        self.names = (f"nf{tag}n0", f"nf{tag}n1")
        self.links = (f"nf{tag}v0", f"nf{tag}v1")  # interface names stay under 16 bytes
        subnet = random.randint(1, 254)
        self.addrs = (f"10.213.{subnet}.1", f"10.213.{subnet}.2")

    def __enter__(self) -> "NetnsPair":
        try:
            for name in self.names:
                self._must("netns", "add", name)
            self._must("link", "add", self.links[0], "type", "veth", "peer", "name", self.links[1])
            for name, link, addr in zip(self.names, self.links, self.addrs):
                self._must("link", "set", link, "netns", name)
                self._must("-n", name, "addr", "add", f"{addr}/24", "dev", link)
                self._must("-n", name, "link", "set", link, "up")
                self._must("-n", name, "link", "set", "lo", "up")
        except BaseException:
            self.cleanup()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.cleanup()

    @staticmethod
    def _must(*args: str) -> None:
        done = _ip(*args)
        if done.returncode != 0:
            raise RuntimeError(f"ip {' '.join(args)} failed: {done.stderr.strip()}")

    def cut(self) -> None:
        """Take node 0's end of the link down: packets between the nodes are dropped."""
        self._must("-n", self.names[0], "link", "set", self.links[0], "down")

    def launch(self, node: int, port: int, secret: str, out: Path, seconds: float,
               nproc: int = 2) -> subprocess.Popen:
        argv = ["ip", "netns", "exec", self.names[node], sys.executable, "-m",
                "neural_arch.distributed.launcher", "--nnodes=2", f"--node_rank={node}",
                f"--nproc_per_node={nproc}", f"--master_addr={self.addrs[0]}",
                f"--master_port={port}", "--backend=tcp", JOB, "--", "--out", str(out),
                "--backend", "tcp", "--seconds", str(seconds), "--timeout", "120"]
        log = open(out / f"launcher{node}.log", "wb")
        try:
            return subprocess.Popen(argv, env={**os.environ, "NEURAL_ARCH_SECRET": secret},
                                    cwd=REPO_ROOT, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        finally:
            log.close()

    def cleanup(self) -> None:
        """Kill whatever still runs in the namespaces, then delete them (and the veth pair)."""
        for name in self.names:
            for pid in _ip("netns", "pids", name).stdout.split():
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except (ProcessLookupError, ValueError):
                    pass
            _ip("netns", "del", name)


def finish(launchers, limit: float) -> list:
    """Exit codes of ``launchers``; any still running after ``limit`` is killed (code None)."""
    deadline, codes = time.monotonic() + limit, []
    for proc in launchers:
        try:
            codes.append(proc.wait(timeout=max(0.1, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            codes.append(None)
    return codes


def logs(out: Path) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2500:]}"
                     for p in sorted(out.glob("launcher*.log")))


@pytest.fixture
def pair():
    reason = namespaces_unavailable()
    if reason:
        pytest.skip(reason)
    with NetnsPair() as made:
        yield made


def test_two_node_all_reduce_is_exact(pair, tmp_path):
    port, secret = random.randint(20000, 60000), secrets.token_hex(16)
    launchers = [pair.launch(node, port, secret, tmp_path, seconds=2.0) for node in (0, 1)]
    assert finish(launchers, 120) == [0, 0], logs(tmp_path)
    done = [json.loads((tmp_path / f"done_{r}.json").read_text()) for r in range(4)]
    expected = float((np.arange(fault_injection_job.ELEMENTS) % 1000.0 * 10).sum())
    assert [d["result_sum"] for d in done] == [expected] * 4
    assert len({d["steps"] for d in done}) == 1 and done[0]["steps"] > 3
    # Ranks 0-1 ran in node 0's namespace, ranks 2-3 in node 1's.
    spaces = [d["net_namespace"] for d in done]
    assert spaces[0] == spaces[1] != spaces[2] == spaces[3]


def test_cut_link_fails_every_rank_in_time_and_both_launchers(pair, tmp_path):
    port, secret = random.randint(20000, 60000), secrets.token_hex(16)
    launchers = [pair.launch(node, port, secret, tmp_path, seconds=90.0) for node in (0, 1)]
    try:
        looping = lambda: all((tmp_path / f"looping_{r}.json").exists() for r in range(4))
        assert wait_for(looping, 60, launchers), logs(tmp_path)
        cut_at = time.time()
        pair.cut()
        codes = finish(launchers, 60)
    finally:
        finish(launchers, 0)
    assert all(code not in (0, None) for code in codes), (codes, logs(tmp_path))
    for rank in range(4):
        path = tmp_path / f"error_{rank}.json"
        assert path.exists(), f"rank {rank} reported no error\n{logs(tmp_path)}"
        error = json.loads(path.read_text())
        assert error["type"] == "PeerFailureError", error
        assert error["op"] == "all_reduce:sum" and error["peer"] in range(4), error
        assert error["message"].startswith(f"[rank {rank}, all_reduce:sum #"), error
        assert f"peer rank {error['peer']}]" in error["message"], error
        assert error["time"] - cut_at < DETECT_LIMIT_S, (rank, error["time"] - cut_at, error)
