"""``python -m neural_arch.horovod.run`` (the project's ``horovodrun``): the Horovod-style
example trains on 2 and 3 ranks with bit-identical replicas at the end, every rank sees
Horovod's variables, and ``-H`` maps onto the launcher's multi-node options (tried for real
with two "hosts" that are both this machine)."""
from __future__ import annotations

import glob
import json
import os
import secrets
import subprocess
import sys

import numpy as np
import pytest

from dist_harness import free_port

pytestmark = pytest.mark.timeout(300)
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLE = os.path.join(ROOT, "examples", "train_horovod.py")
RUN = [sys.executable, "-m", "neural_arch.horovod.run"]


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_PORT"):
        env.pop(name, None)
    return env


def _replicas(out_dir) -> list:
    files = sorted(glob.glob(os.path.join(out_dir, "rank*.npz")))
    return [dict(np.load(f)) for f in files]


@pytest.mark.parametrize("np_, extra", [(2, []), (3, ["--uneven", "--backward-passes", "2"])],
                         ids=["np2", "np3-uneven-accumulate"])
def test_the_example_trains_with_bit_identical_replicas(tmp_path, np_, extra):
    out = tmp_path / "params"
    result = subprocess.run(RUN + ["-np", str(np_), sys.executable, EXAMPLE, "--out", str(out)]
                            + extra, capture_output=True, text=True, timeout=280, env=_env(),
                            cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    replicas = _replicas(out)
    assert len(replicas) == np_
    for other in replicas[1:]:
        assert other.keys() == replicas[0].keys()
        for name in replicas[0]:
            np.testing.assert_array_equal(other[name], replicas[0][name])
    if extra:
        assert "[rank 0] last rank to join: 0" in result.stdout
    else:
        assert "[rank 0] epoch 1: loss" in result.stdout


REPORT = """
import json, os, sys
import numpy as np
import neural_arch.horovod as hvd
hvd.init()
print("REPORT " + json.dumps({"env": {k: v for k, v in os.environ.items()
                                      if k.startswith("HOROVOD_") and k != "HOROVOD_HOSTNAME"},
                              "hvd": [hvd.rank(), hvd.size(), hvd.local_rank(),
                                      hvd.local_size(), hvd.cross_rank(), hvd.cross_size()],
                              "sum": float(hvd.allreduce(np.ones(1), op=hvd.Sum)[0]),
                              "args": sys.argv[1:]}), flush=True)
hvd.shutdown()
"""


def _reports(stdout: str) -> dict:
    reports = [json.loads(line.split("REPORT ", 1)[1]) for line in stdout.splitlines()
               if "REPORT " in line]
    return {r["hvd"][0]: r for r in reports}


def test_every_rank_gets_horovods_variables(tmp_path):
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    result = subprocess.run(RUN + ["-np", "2", "-H", "localhost:4", sys.executable, str(script),
                                   "--flag", "x"], capture_output=True, text=True, timeout=120,
                            env=_env())
    assert result.returncode == 0, result.stderr[-3000:]
    reports = _reports(result.stdout)
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        assert report["env"] == {"HOROVOD_RANK": str(rank), "HOROVOD_SIZE": "2",
                                 "HOROVOD_LOCAL_RANK": str(rank), "HOROVOD_LOCAL_SIZE": "2",
                                 "HOROVOD_CROSS_RANK": "0", "HOROVOD_CROSS_SIZE": "1"}
        assert report["hvd"] == [rank, 2, rank, 2, 0, 1]
        assert report["sum"] == 2.0 and report["args"] == ["--flag", "x"]


def test_two_hosts_each_run_their_share(tmp_path):
    """-H with two host names that are both this machine: each runner starts its node's rank
    with --node-rank, and they meet over tcp at the first host's port."""
    script = tmp_path / "report.py"
    script.write_text(REPORT)
    env = _env()
    env["NEURAL_ARCH_SECRET"] = secrets.token_hex(32)
    port = str(free_port())
    runners = [subprocess.Popen(RUN + ["-np", "2", "-H", "127.0.0.1:1,localhost:1", "-p", port,
                                       "--node-rank", str(k), sys.executable, str(script)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=env) for k in (0, 1)]
    outputs = []
    try:
        for runner in runners:
            stdout, stderr = runner.communicate(timeout=150)
            assert runner.returncode == 0, stderr[-3000:]
            outputs.append(stdout)
    finally:
        for runner in runners:
            if runner.poll() is None:
                runner.kill()
    reports = {**_reports(outputs[0]), **_reports(outputs[1])}
    assert sorted(reports) == [0, 1]
    for rank, report in reports.items():
        assert report["hvd"] == [rank, 2, 0, 1, rank, 2]  # one rank per host, 2 hosts
        assert report["sum"] == 2.0


def test_host_lists_map_onto_the_launchers_options():
    from neural_arch.horovod.run import parse_hosts, plan
    assert parse_hosts("a:2,b") == [("a", 2), ("b", 1)]
    single = plan(["-np", "3", "python", "train.py", "--lr", "1"])
    assert single.launcher_kwargs() == {
        "nproc_per_node": 3, "nnodes": 1, "node_rank": 0, "master_addr": "127.0.0.1",
        "backend": "auto", "script_args": ["python", "train.py", "--lr", "1"],
        "run_module": True, "standalone": True}
    multi = plan(["-np", "4", "-H", "h1:2,h2:2,h3:2", "--node-rank", "1", "-p", "1234",
                  "python", "t.py"])
    assert (multi.nproc_per_node, multi.nnodes, multi.node_rank, multi.master_addr,
            multi.master_port, multi.backend) == (2, 2, 1, "h1", 1234, "tcp")
    with pytest.raises(ValueError, match="on h2: .* --node-rank 1"):
        plan(["-np", "4", "-H", "h1:2,h2:2", "python", "t.py"])
    with pytest.raises(ValueError, match=r"places \[2, 1\] ranks"):
        plan(["-np", "3", "-H", "h1:2,h2:2", "--node-rank", "0", "python", "t.py"])
    with pytest.raises(ValueError, match="more ranks than the 2 slots"):
        plan(["-np", "3", "-H", "localhost:2", "python", "t.py"])
    with pytest.raises(ValueError, match="another machine"):
        plan(["-np", "2", "-H", "elsewhere.example:2", "python", "t.py"])
    with pytest.raises(ValueError, match="not host:slots"):
        plan(["-np", "2", "-H", "a:x", "python", "t.py"])
    with pytest.raises(ValueError, match="no command"):
        plan(["-np", "2"])
