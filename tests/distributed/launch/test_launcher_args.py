"""Launcher command-line parsing and configuration, without starting processes."""
from __future__ import annotations

import sys

import pytest

from neural_arch.distributed.launcher import main
from neural_arch.distributed.launch.args import (LaunchConfig, build_parser, cpu_count,
                                                 parse_launcher_args, split_command_line)

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("argv, launcher, script, script_args", [
    (["--nproc_per_node=4", "train.py", "--lr", "1"], ["--nproc_per_node=4"], "train.py",
     ["--lr", "1"]),
    (["train.py", "--nproc-per-node", "4", "--lr", "1"], ["--nproc_per_node=4"], "train.py",
     ["--lr", "1"]),
    (["train.py", "--lr", "1", "--", "--nnodes", "2"], [], "train.py",
     ["--lr", "1", "--nnodes", "2"]),
    (["--nnodes=2", "--", "train.py", "--node_rank=1"], ["--nnodes=2"], "train.py",
     ["--node_rank=1"]),
    (["train.py", "-h"], [], "train.py", ["-h"]),
    (["-m", "pkg.train", "-m", "x"], ["-m"], "pkg.train", ["-m", "x"]),
    (["--standalone", "t.py", "--no-prefix", "--master-addr", "-", "x"],
     ["--standalone", "--no_prefix", "--master_addr=-"], "t.py", ["x"]),
    (["t.py", "--nproc", "2", "-1"], [], "t.py", ["--nproc", "2", "-1"]),  # no abbreviations
    (["--bogus", "t.py"], ["--bogus"], "t.py", []),  # argparse reports it
    (["t.py", "--backend"], ["--backend"], "t.py", []),  # argparse reports the missing value
    (["--max_restarts", "--", "t.py"], ["--max_restarts"], "t.py", []),
])
def test_split_command_line(argv, launcher, script, script_args):
    assert split_command_line(argv, build_parser()) == (launcher, script, script_args)


def test_parse_both_orders_agree():
    before = parse_launcher_args(["--nproc_per_node", "3", "--nnodes=2", "--node-rank", "1",
                                  "--master_addr", "10.0.0.1", "--master_port=1234",
                                  "--backend", "tcp", "--max_restarts=2", "--log-dir", "logs",
                                  "--timeout", "9.5", "--no_prefix", "t.py", "a", "--b"])
    after = parse_launcher_args(["t.py", "a", "--nproc-per-node=3", "--nnodes", "2",
                                 "--node_rank=1", "--master-addr=10.0.0.1", "--b",
                                 "--master-port", "1234", "--backend=tcp", "--max-restarts",
                                 "2", "--log_dir=logs", "--timeout=9.5", "--no-prefix"])
    keys = ("nproc_per_node", "nnodes", "node_rank", "master_addr", "master_port", "backend",
            "max_restarts", "log_dir", "timeout", "no_prefix", "script", "script_args")
    expected = ("3", 2, 1, "10.0.0.1", 1234, "tcp", 2, "logs", 9.5, True, "t.py", ["a", "--b"])
    assert tuple(getattr(before, k) for k in keys) == expected
    assert tuple(getattr(after, k) for k in keys) == expected


def test_defaults_follow_the_environment(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "10.1.2.3")
    monkeypatch.setenv("MASTER_PORT", "2345")
    monkeypatch.delenv("NEURAL_ARCH_BACKEND", raising=False)
    monkeypatch.delenv("NEURAL_FORGE_BACKEND", raising=False)
    args = parse_launcher_args(["t.py"])
    assert (args.master_addr, args.master_port, args.backend, args.max_restarts) == \
        ("10.1.2.3", 2345, "auto", 0)


@pytest.mark.parametrize("argv, fragment", [
    (["--nproc_per_node=0", "{script}"], "nproc_per_node must be a positive integer or 'auto', "
                                         "got 0"),
    (["{script}", "--nproc_per_node", "many"], "got 'many'"),
    (["{script}", "--nnodes=2", "--node_rank=2"], "node_rank=2 with nnodes=2"),
    (["{script}", "--backend=carrier"], "argument --backend: invalid choice: 'carrier'"),
    (["{script}", "--master_port=http"], "argument --master_port/--master-port: invalid int "
                                         "value: 'http'"),
    (["{script}", "--master_port=0"], "master_port must be in [1, 65535], got 0"),
    (["{script}", "--max_restarts=-2"], "max_restarts must be >= 0, got -2"),
    (["{script}", "--timeout=0"], "timeout must be > 0 seconds, got 0.0"),
    (["--bogus", "{script}"], "unrecognized arguments: --bogus"),
    (["{script}", "--standalone", "--nnodes=2"], "standalone runs on one node, got nnodes=2"),
    (["--nproc_per_node=2"], "required: SCRIPT"),
    (["missing_train.py"], "script not found: 'missing_train.py'"),
    (["--nproc_per_node=2", "{script}", "--nproc-per-node", "4"],
     "launcher option --nproc_per_node is given 2 times ('2', '4'); give it once"),
    (["{script}", "--nnodes", "1", "--lr", "3", "--nnodes=1"],
     "launcher option --nnodes is given 2 times ('1', '1')"),
    (["--standalone", "{script}", "--standalone"],
     "launcher option --standalone is given 2 times; give it once"),
    (["{script}", "--nproc_per_node=2", "--backend", "mpi"],
     "backend 'mpi' needs ranks started by MPI"),
])
def test_bad_command_lines_exit_2_naming_option_and_value(tmp_path, monkeypatch, capsys, argv,
                                                           fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("")
    with pytest.raises(SystemExit) as info:
        main([token.format(script="train.py") for token in argv])
    assert info.value.code == 2
    assert fragment in capsys.readouterr().err


def make_config(tmp_path, **kwargs):
    script = tmp_path / "train.py"
    script.write_text("")
    return LaunchConfig(str(script), **kwargs)


def test_nproc_auto_is_the_cpu_count(tmp_path):
    assert make_config(tmp_path, nproc_per_node="auto").nproc_per_node == cpu_count()
    assert make_config(tmp_path, nproc_per_node=" 3 ").nproc_per_node == 3


def test_worker_environment_numbers_ranks_across_nodes(tmp_path):
    config = make_config(tmp_path, nproc_per_node=4, nnodes=3, node_rank=2,
                         master_addr="head", master_port=4000, backend="gloo",
                         env={"NEURAL_ARCH_SECRET": "s" * 16})
    job_env, notes = config.job_environment()
    for local_rank in range(4):
        env = config.worker_environment(job_env, local_rank, restart_count=5)
        assert {k: env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                    "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT",
                                    "NEURAL_ARCH_BACKEND", "RESTART_COUNT",
                                    "NEURAL_ARCH_SECRET")} == {
            "RANK": str(8 + local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "12",
            "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "2", "NODE_RANK": "2", "MASTER_ADDR": "head",
            "MASTER_PORT": "4000", "NEURAL_ARCH_BACKEND": "gloo", "RESTART_COUNT": "5",
            "NEURAL_ARCH_SECRET": "s" * 16}


def test_multi_node_without_secret_does_not_invent_one(tmp_path, monkeypatch):
    monkeypatch.delenv("NEURAL_ARCH_SECRET", raising=False)
    multi = make_config(tmp_path, nnodes=2, node_rank=1)
    job_env, notes = multi.job_environment()
    assert "NEURAL_ARCH_SECRET" not in job_env
    assert any("NEURAL_ARCH_SECRET" in note and "every node" in note for note in notes)
    single = make_config(tmp_path)
    secrets = {single.job_environment()[0]["NEURAL_ARCH_SECRET"] for _ in range(2)}
    assert len(secrets) == 2  # fresh per job


def test_mpi_rank_variables_are_not_passed_on(tmp_path, monkeypatch):
    # A launcher started by mpirun: its workers are not those MPI ranks.
    for name in ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"):
        monkeypatch.setenv(name, "3")
    monkeypatch.setenv("OMPI_MCA_btl", "self,tcp")
    job_env, _ = make_config(tmp_path).job_environment()
    assert [n for n in job_env if n.startswith(("OMPI_COMM_WORLD_", "PMI_", "PMIX_"))] == []
    assert job_env["OMPI_MCA_btl"] == "self,tcp"  # configuration is kept


@pytest.mark.parametrize("name, value, error", [
    ("monitor_interval", 0, ValueError), ("grace_period", -1.0, ValueError),
    ("timeout", "soon", TypeError), ("timeout", 0.0, ValueError),
])
def test_seconds_options_are_checked(tmp_path, name, value, error):
    with pytest.raises(error, match=f"{name} must be"):
        make_config(tmp_path, **{name: value})


def test_help_documents_option_capture_and_the_double_dash(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "after SCRIPT the launcher still takes every option named above" in text
    assert "'--' ends the launcher's options: all that follows goes to the script verbatim" \
        in text
    assert "train.py --lr 0.1 -- --nnodes 8 gives train.py '--lr 0.1 --nnodes 8'" in text
    assert "An option given twice is an error naming it" in text


def test_the_seeds_order_options_after_the_script_still_parses():
    args = parse_launcher_args(["t.py", "--epochs", "3", "--nproc_per_node=2", "--",
                                "--nproc_per_node=9"])
    assert (args.nproc_per_node, args.script_args) == ("2", ["--epochs", "3",
                                                            "--nproc_per_node=9"])


@pytest.mark.parametrize("env, backend", [
    ({"NEURAL_FORGE_BACKEND": "tcp"}, "tcp"),
    ({"NEURAL_ARCH_BACKEND": "shm", "NEURAL_FORGE_BACKEND": "shm"}, "shm"),
    ({}, "auto"),
])
def test_backend_default_reads_the_alias_too(monkeypatch, env, backend):
    for name in ("NEURAL_ARCH_BACKEND", "NEURAL_FORGE_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert parse_launcher_args(["t.py"]).backend == backend
    assert parse_launcher_args(["t.py", "--backend=gloo"]).backend == "gloo"


def test_backend_and_alias_that_disagree_exit_2_naming_both(monkeypatch, capsys):
    monkeypatch.setenv("NEURAL_ARCH_BACKEND", "shm")
    monkeypatch.setenv("NEURAL_FORGE_BACKEND", "tcp")
    with pytest.raises(SystemExit) as info:
        parse_launcher_args(["t.py"])
    assert info.value.code == 2
    assert "NEURAL_ARCH_BACKEND='shm' and its alias NEURAL_FORGE_BACKEND='tcp' disagree" in \
        capsys.readouterr().err


def test_workers_get_the_backend_once_not_a_stale_alias(tmp_path, monkeypatch):
    monkeypatch.setenv("NEURAL_FORGE_BACKEND", "tcp")
    config = make_config(tmp_path, backend="shm")
    job_env, _ = config.job_environment()
    env = config.worker_environment(job_env, 0, 0)
    assert env["NEURAL_ARCH_BACKEND"] == "shm" and "NEURAL_FORGE_BACKEND" not in env


def test_backend_mpi_is_refused_with_the_mpirun_command(tmp_path):
    with pytest.raises(ValueError) as info:
        make_config(tmp_path, nproc_per_node=4, backend="mpi", script_args=["--lr", "0.1"])
    message = str(info.value)
    assert "Run the job with mpirun (or mpiexec" in message
    assert f"-n 4 {sys.executable} {tmp_path / 'train.py'} --lr 0.1" in message
    assert "--oversubscribe" in message
