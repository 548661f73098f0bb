"""Rendezvous information from launcher environments (ours, Open MPI, PMI, SLURM) and URLs."""
import pytest

from neural_arch.distributed.rendezvous.env import (RendezvousInfo, backend_from_environment,
                                                    expand_nodelist, is_launched_by_mpi, resolve)

pytestmark = pytest.mark.timeout(30)


def test_nothing_set_is_a_single_process_job():
    assert resolve(environ={}) == RendezvousInfo(0, 1, 0, 1, "127.0.0.1", 29500, "env")


def test_reads_the_process_environment_by_default(monkeypatch):
    for name, value in {"RANK": "2", "WORLD_SIZE": "4", "LOCAL_RANK": "0",
                        "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "node7",
                        "MASTER_PORT": "1234"}.items():
        monkeypatch.setenv(name, value)
    assert resolve() == RendezvousInfo(2, 4, 0, 2, "node7", 1234, "env")


def test_open_mpi_variables():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "8",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
           "MASTER_ADDR": "10.0.0.1"}
    assert resolve(environ=env) == RendezvousInfo(3, 8, 1, 2, "10.0.0.1", 29500, "mpi")
    assert is_launched_by_mpi(env)


def test_pmi_variables():
    env = {"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}
    assert resolve(environ=env) == RendezvousInfo(5, 6, 2, 3, "127.0.0.1", 29500, "pmi")
    assert is_launched_by_mpi(env)


def test_slurm_variables_and_master_from_node_list():
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_NODEID": "2",
           "SLURM_TASKS_PER_NODE": "2(x4)", "SLURM_NODELIST": "gpu[07-10]",
           "SLURM_STEP_NODELIST": "gpu[08-10]"}
    assert resolve(environ=env) == RendezvousInfo(5, 8, 1, 2, "gpu08", 29500, "slurm")
    assert not is_launched_by_mpi(env)  # plain srun without PMI is not an MPI launch
    uneven = dict(env, SLURM_TASKS_PER_NODE="3(x2),1,1", SLURM_NODEID="2", SLURM_PROCID="6",
                  SLURM_LOCALID="0")
    assert resolve(environ=uneven).local_world_size == 1


def test_precedence_env_then_mpi_then_pmi_then_slurm():
    # GROUP_RANK: a launcher started by the outer ones set RANK/WORLD_SIZE for its own workers
    env = {"RANK": "1", "WORLD_SIZE": "2", "GROUP_RANK": "0", "OMPI_COMM_WORLD_RANK": "0",
           "OMPI_COMM_WORLD_SIZE": "4", "PMI_RANK": "0", "PMI_SIZE": "4",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    assert resolve(environ=env).launcher == "env"
    del env["RANK"], env["WORLD_SIZE"]
    assert resolve(environ=env).launcher == "mpi"
    del env["OMPI_COMM_WORLD_RANK"], env["OMPI_COMM_WORLD_SIZE"]
    assert resolve(environ=env).launcher == "pmi"
    del env["PMI_RANK"], env["PMI_SIZE"]
    assert resolve(environ=env).launcher == "slurm"


def test_explicit_arguments_override_and_tcp_url():
    env = {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "ignored", "MASTER_PORT": "1"}
    info = resolve("tcp://10.1.2.3:4567", world_size=4, rank=3, environ=env)
    assert info == RendezvousInfo(3, 4, 3, 4, "10.1.2.3", 4567, "explicit")
    assert resolve("tcp://[::1]:80", world_size=1, rank=0, environ={}).master_addr == "::1"


MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}


def test_missing_local_variables_default_to_one_host():
    info = resolve(environ={"RANK": "3", "WORLD_SIZE": "4", **MASTER})
    assert (info.local_rank, info.local_world_size) == (3, 4)
    info = resolve(environ={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", **MASTER})
    assert (info.local_rank, info.local_world_size) == (1, 2)


@pytest.mark.parametrize("env, kwargs, message", [
    ({"RANK": "x", "WORLD_SIZE": "2"}, {}, "RANK='x'"),
    ({"RANK": "0", "WORLD_SIZE": "two"}, {}, "WORLD_SIZE='two'"),
    ({"RANK": "2", "WORLD_SIZE": "2"}, {}, r"RANK=2 is outside \[0, WORLD_SIZE=2\)"),
    ({"RANK": "-1", "WORLD_SIZE": "2"}, {}, "RANK=-1"),
    ({"RANK": "0", "WORLD_SIZE": "0"}, {}, "WORLD_SIZE must be >= 1, got 0"),
    ({"OMPI_COMM_WORLD_RANK": "1"}, {}, "OMPI_COMM_WORLD_SIZE is not"),
    ({}, {"world_size": 3}, "no rank"),
    ({}, {"rank": 5, "world_size": 2}, r"rank=5 is outside \[0, world_size=2\)"),
    ({"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2", **MASTER}, {},
     "LOCAL_RANK=2"),
    ({"MASTER_PORT": "70000"}, {}, "MASTER_PORT=70000"),
    ({"MASTER_PORT": "http"}, {}, "MASTER_PORT='http'"),
    ({}, {"init_method": "tcp://host"}, "tcp://host:port"),
    ({}, {"init_method": "tcp://host:99999"}, "invalid port"),
    ({}, {"init_method": "file:///tmp/x"}, "init_method must be"),
])
def test_bad_values_raise_value_error_naming_them(env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve(environ=env, **kwargs)


@pytest.mark.parametrize("env, kwargs, message", [
    # A Kubernetes job file that sets the world size but leaves the rank to someone else.
    ({"WORLD_SIZE": "4", **MASTER}, {}, r"WORLD_SIZE=4 but no rank: set RANK \(0\.\.3\)"),
    ({"WORLD_SIZE": "1"}, {}, "WORLD_SIZE=1 but no rank: set RANK"),
    ({"RANK": "0"}, {}, "RANK=0 is set but WORLD_SIZE is not"),
    ({"RANK": "1", **MASTER}, {}, "RANK=1 is set but WORLD_SIZE is not"),
    ({}, {"rank": 0}, "rank=0 is set but WORLD_SIZE is not: set WORLD_SIZE too, or pass "
                      "world_size="),
    ({"RANK": "1", "WORLD_SIZE": "2"}, {}, "MASTER_ADDR and MASTER_PORT are not set for rank 1 "
                                           "of 2"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h"}, {}, "MASTER_PORT is not set"),
    ({"RANK": "1", "WORLD_SIZE": "2", "MASTER_PORT": "7"}, {}, "MASTER_ADDR is not set"),
    # Under mpirun a stray WORLD_SIZE must at least agree with the MPI world.
    ({"WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "2"}, {},
     "WORLD_SIZE=4 disagrees with OMPI_COMM_WORLD_SIZE=2"),
])
def test_half_set_env_contract_names_what_is_missing(env, kwargs, message):
    with pytest.raises(ValueError, match=message):
        resolve(environ=env, **kwargs)


def test_complete_or_absent_env_contracts_still_resolve():
    assert resolve(environ={"RANK": "0", "WORLD_SIZE": "1"}).world_size == 1
    assert resolve(environ={"WORLD_SIZE": "4", **MASTER}, rank=2).rank == 2
    assert resolve(environ={"RANK": "1", **MASTER}, world_size=2).rank == 1
    assert resolve(world_size=1, environ={}).rank == 0
    # mpirun, srun and an explicit tcp:// name their master (or need none): no MASTER_* asked.
    mpi = {"WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"}
    assert (resolve(environ=mpi).rank, resolve(environ=mpi).launcher) == (1, "mpi")
    slurm = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_NODELIST": "n[1-2]"}
    assert resolve(environ=slurm).master_addr == "n1"
    assert resolve("tcp://h:5", environ={"RANK": "1", "WORLD_SIZE": "2"}).master_port == 5
    # A store handed to init_process_group (or the MPI backend) needs no master address.
    info = resolve(environ={"RANK": "1", "WORLD_SIZE": "2"}, master_needed=False)
    assert (info.rank, info.world_size) == (1, 2)


@pytest.mark.parametrize("env, expected", [
    ({}, None), ({"NEURAL_ARCH_BACKEND": "shm"}, "shm"), ({"NEURAL_FORGE_BACKEND": "tcp"}, "tcp"),
    ({"NEURAL_ARCH_BACKEND": "tcp", "NEURAL_FORGE_BACKEND": "TCP"}, "tcp"),
    ({"NEURAL_ARCH_BACKEND": " ", "NEURAL_FORGE_BACKEND": "mpi"}, "mpi"),
])
def test_backend_variable_and_its_alias(env, expected):
    assert backend_from_environment(env) == expected


def test_backend_variable_and_alias_that_disagree_name_both():
    with pytest.raises(ValueError, match="NEURAL_ARCH_BACKEND='shm' and its alias "
                                         "NEURAL_FORGE_BACKEND='tcp' disagree"):
        backend_from_environment({"NEURAL_ARCH_BACKEND": "shm", "NEURAL_FORGE_BACKEND": "tcp"})


def test_non_integer_arguments_raise_type_error():
    with pytest.raises(TypeError, match="rank must be an int"):
        resolve(rank="0", world_size=1, environ={})


def test_expand_nodelist_forms():
    assert expand_nodelist("node[01-04]") == ["node01", "node02", "node03", "node04"]
    assert expand_nodelist("a,b[1,3-4],c") == ["a", "b1", "b3", "b4", "c"]
    assert expand_nodelist("r[1-2]-n[9-10]") == ["r1-n9", "r1-n10", "r2-n9", "r2-n10"]
    assert expand_nodelist("solo") == ["solo"]
    with pytest.raises(ValueError, match="node\\[a-b\\]"):
        expand_nodelist("node[a-b]")


def test_is_launched_by_mpi_markers():
    assert not is_launched_by_mpi({})
    assert not is_launched_by_mpi({"RANK": "0", "WORLD_SIZE": "1"})
    assert is_launched_by_mpi({"OMPI_COMM_WORLD_SIZE": "2"})
    assert is_launched_by_mpi({"PMIX_RANK": "0"})


@pytest.mark.parametrize("rank", [0, 1])
def test_slurm_ranks_of_a_job_of_several_need_a_node_list_or_master_addr(rank):
    """As a half-set env:// contract: each rank would otherwise take its own host for rank 0's."""
    env = {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "2", "SLURM_JOB_ID": "77",
           "SLURM_STEP_ID": "0", "SLURM_NODELIST": " "}
    with pytest.raises(ValueError, match=rf"rank {rank} of 2 \(from SLURM_PROCID={rank}, "
                                         r"SLURM_NTASKS=2\): neither SLURM_STEP_NODELIST nor "
                                         r"SLURM_NODELIST \(nor MASTER_ADDR\)"):
        resolve(environ=env)
    assert resolve(environ=dict(env, MASTER_ADDR="n7")).master_addr == "n7"
    assert resolve(environ=dict(env, SLURM_STEP_NODELIST="n[3-4]")).master_addr == "n3"
    # a store handed in, or an explicit tcp:// master, needs no list
    assert resolve(environ=env, master_needed=False).rank == rank
    assert resolve("tcp://h:5", environ=env).master_addr == "h"


def test_a_one_task_slurm_job_may_meet_on_this_host():
    info = resolve(environ={"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_ID": "77"})
    assert (info.world_size, info.master_addr) == (1, "127.0.0.1")
