"""``python -m neural_arch.cli train``: the script's ranks start on our launcher (ddp) or our
horovodrun (horovod), from a plain shell and from inside a launcher, and every rank sees the
job (its all-reduce equals the NumPy sum); engines and spellings it cannot run are refused with
one line naming them. Real processes; each rank writes what it saw to a file."""
import json
import os
import subprocess
import sys
import textwrap

import pytest

from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

pytestmark = pytest.mark.timeout(120)
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                      "MASTER_PORT", "NEURAL_ARCH_BACKEND", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                      "PMI_RANK", "HOROVOD_RANK")

DDP_SCRIPT = """\
import json, os, sys
import numpy as np
import neural_arch.distributed as dist
dist.init_process_group()
x = np.array([float(dist.get_rank() + 1)])
dist.all_reduce(x)
with open(os.path.join(sys.argv[1], f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"world": dist.get_world_size(), "sum": float(x[0]), "argv": sys.argv[2:]}, f)
dist.destroy_process_group()
"""
HOROVOD_SCRIPT = """\
import json, os, sys
import numpy as np
import neural_arch.horovod as hvd
hvd.init()
total = hvd.allreduce(np.array([float(hvd.rank() + 1)]), op=hvd.Sum)
with open(os.path.join(sys.argv[1], f"rank{hvd.rank()}.json"), "w") as f:
    json.dump({"world": hvd.size(), "sum": float(total[0]), "argv": sys.argv[2:]}, f)
hvd.shutdown()
"""


def clean_env():
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARIABLES}
    env["NEURAL_ARCH_SECRET"] = "cli-test-secret-0123456789"
    return env


def run(*argv, timeout=90):
    return subprocess.run([sys.executable, *map(str, argv)], env=clean_env(), text=True,
                          capture_output=True, timeout=timeout)


def script(tmp_path, text):
    path = tmp_path / "train.py"
    path.write_text(text)
    out = tmp_path / "out"
    out.mkdir()
    return path, out


def seen(out, world):
    records = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for record in records:
        assert record["world"] == world and record["sum"] == world * (world + 1) / 2, records
    return records


@pytest.mark.parametrize("spelling", [["--nproc", "2", "--backend", "ddp"],
                                      ["--num-gpus", "3", "--backend", "pytorch-ddp"]])
def test_ddp_starts_the_ranks_on_the_launcher(tmp_path, spelling):
    path, out = script(tmp_path, DDP_SCRIPT)
    done = run("-m", "neural_arch.cli", "train", "--script", path, *spelling, "--", out, "--lr",
               "0.1")
    assert done.returncode == 0, done.stderr
    records = seen(out, int(spelling[1]))
    assert records[0]["argv"] == ["--lr", "0.1"]


def test_horovod_starts_the_ranks_on_horovodrun(tmp_path):
    path, out = script(tmp_path, HOROVOD_SCRIPT)
    done = run("-m", "neural_arch.cli", "train", "--script", path, "--num-gpus", "2",
               "--backend", "horovod", "--", out)
    assert done.returncode == 0, done.stderr
    seen(out, 2)


def test_under_horovodrun_the_command_runs_the_script_in_each_rank(tmp_path):
    path, out = script(tmp_path, HOROVOD_SCRIPT)
    done = run("-m", "neural_arch.horovod.run", "-np", "2", sys.executable, "-m",
               "neural_arch.cli", "train", "--script", path, "--backend", "horovod", "--", out)
    assert done.returncode == 0, done.stderr
    seen(out, 2)  # two ranks, not two ranks each starting two more


def test_under_the_launcher_the_command_runs_the_script_in_each_rank(tmp_path):
    path, out = script(tmp_path, DDP_SCRIPT)
    # the launcher reads options after the module too: the command's own go after its "--"
    done = run("-m", "neural_arch.distributed.launcher", "--nproc-per-node", "2", "-m",
               "neural_arch.cli", "--", "train", "--script", path, "--backend", "ddp", "--", out)
    assert done.returncode == 0, done.stderr
    seen(out, 2)
    assert not (out / "rank2.json").exists()


@pytest.mark.parametrize("extra, message", [
    (["--backend", "ray", "--nnodes", "2"], "--backend ray places the workers"),
    (["--backend", "mpi"], "--backend 'mpi' is not one of ddp, horovod, pytorch-ddp, ray"),
    (["--address", "ray://head:10001"], "applies to --backend ray only"),
    (["--nnodes", "2", "--node-rank", "2"], "--node-rank must be in [0, 2)"),
    (["--backend", "horovod", "--nnodes", "2"], "for several nodes use horovodrun -H"),
])
def test_what_it_cannot_run_is_refused_in_one_line(tmp_path, extra, message):
    path, out = script(tmp_path, DDP_SCRIPT)
    done = run("-m", "neural_arch.cli", "train", "--script", path, *extra, "--", out)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert message in done.stderr, done.stderr
    assert not list(out.iterdir())


def test_a_missing_script_is_named(tmp_path):
    done = run("-m", "neural_arch.cli", "train", "--script", tmp_path / "nope.py")
    assert done.returncode == 2 and "nope.py' is not a file" in done.stderr, done.stderr
