"""The resolver on each launcher family, on contradictory and half-set environments: a table of
environments and what each must give (rank, world, local rank, master, deciding family, the
variables that decided) or the error, naming the variables, it must raise."""
import pytest

from neural_arch.distributed.rendezvous.env import resolve, slurm_port

pytestmark = pytest.mark.timeout(30)

MASTER = {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29400"}
SRUN = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_NODELIST": "gpu[07-08]"}

# environment -> (rank, world, local rank, local world, addr, port, family, {field: source})
RESOLVED = [
    ("torchrun", {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                  "GROUP_RANK": "1", **MASTER},
     (3, 4, 1, 2, "10.0.0.1", 29400, "env"),
     {"rank": "RANK=3", "world_size": "WORLD_SIZE=4", "local_rank": "LOCAL_RANK=1",
      "master_addr": "MASTER_ADDR=10.0.0.1", "master_port": "MASTER_PORT=29400"}),
    ("torchrun inputs only (Kubeflow, one process per node)",
     {"PET_NNODES": "3", "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "2",
      "PET_MASTER_ADDR": "trainer-0", "PET_MASTER_PORT": "23456"},
     (2, 3, 0, 1, "trainer-0", 23456, "pet"),
     {"rank": "PET_NODE_RANK=2", "world_size": "PET_NNODES=3",
      "master_addr": "PET_MASTER_ADDR=trainer-0", "master_port": "PET_MASTER_PORT=23456"}),
    ("Open MPI", {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                  "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4",
                  "PMIX_RANK": "5"},
     (5, 8, 1, 4, "127.0.0.1", 29500, "mpi"),
     {"rank": "OMPI_COMM_WORLD_RANK=5", "local_world_size": "OMPI_COMM_WORLD_LOCAL_SIZE=4",
      "master_port": "default"}),
    ("MPICH PMI", {"PMI_RANK": "2", "PMI_SIZE": "3", "MPI_LOCALRANKID": "2",
                   "MPI_LOCALNRANKS": "3"},
     (2, 3, 2, 3, "127.0.0.1", 29500, "pmi"), {"world_size": "PMI_SIZE=3"}),
    ("PMIx rank with an explicit world size", {"PMIX_RANK": "1", "WORLD_SIZE": "2"},
     (1, 2, 1, 2, "127.0.0.1", 29500, "pmix"),
     {"rank": "PMIX_RANK=1", "world_size": "WORLD_SIZE=2"}),
    ("srun, no MASTER_*: first node, the job's own port",
     {"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "1",
      "SLURM_TASKS_PER_NODE": "2", "PMIX_RANK": "1", **SRUN},
     (1, 2, 1, 2, "gpu07", slurm_port(SRUN), "slurm"),
     {"rank": "SLURM_PROCID=1", "world_size": "SLURM_NTASKS=2",
      "master_addr": "SLURM_NODELIST=gpu[07-08] (its first host)",
      "master_port": "SLURM_JOB_ID=4242, SLURM_STEP_ID=0 (a port of the job's own)"}),
    ("Horovod", {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1",
                 "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1",
                 "HOROVOD_CROSS_SIZE": "2", "OMPI_COMM_WORLD_RANK": "3",
                 "OMPI_COMM_WORLD_SIZE": "4"},
     (3, 4, 1, 2, "127.0.0.1", 29500, "horovod"), {"rank": "HOROVOD_RANK=3"}),
    ("Kubernetes indexed job, WORLD_SIZE", {"JOB_COMPLETION_INDEX": "2", "WORLD_SIZE": "4",
                                            **MASTER},
     (2, 4, 0, 1, "10.0.0.1", 29400, "k8s"),
     {"rank": "JOB_COMPLETION_INDEX=2", "world_size": "WORLD_SIZE=4"}),
    ("Kubernetes indexed job, PET_* world", {"JOB_COMPLETION_INDEX": "1", "PET_NNODES": "2",
                                             "PET_NPROC_PER_NODE": "1", "PET_NODE_RANK": "1",
                                             **MASTER},
     (1, 2, 0, 1, "10.0.0.1", 29400, "k8s"),
     {"world_size": "PET_NNODES=2", "local_world_size": "one process per pod"}),
    # Our launcher inside srun: the SLURM variables describe the launchers, one per node.
    ("launcher nested in srun", {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1",
                                 "LOCAL_WORLD_SIZE": "4", "GROUP_RANK": "1",
                                 "SLURM_PROCID": "1", "SLURM_NTASKS": "2", **SRUN, **MASTER},
     (5, 8, 1, 4, "10.0.0.1", 29400, "env"), {"rank": "RANK=5"}),
    # mpirun from a batch script: SLURM_PROCID=0 is the batch script's, inherited (no step).
    ("mpirun in a batch script", {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
                                  "SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_ID": "7"},
     (1, 4, 1, 4, "127.0.0.1", 29500, "mpi"), {}),
    ("nothing set", {}, (0, 1, 0, 1, "127.0.0.1", 29500, "env"),
     {"rank": "default: no rank variable is set (a job of one)"}),
]


@pytest.mark.parametrize("env, expected, sources", [r[1:] for r in RESOLVED],
                         ids=[r[0] for r in RESOLVED])
def test_each_family_resolves_and_names_its_variables(env, expected, sources):
    info = resolve(environ=env)
    got = (info.rank, info.world_size, info.local_rank, info.local_world_size,
           info.master_addr, info.master_port, info.launcher)
    assert got == expected
    for what, source in sources.items():
        assert info.sources[what] == source, what
    assert set(info.sources) == {"rank", "world_size", "local_rank", "local_world_size",
                                 "master_addr", "master_port"}


FAILING = [
    # contradictory: two families claim this process with the same world and differ
    ("RANK vs Open MPI", {"RANK": "1", "WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0",
                          "OMPI_COMM_WORLD_SIZE": "2", **MASTER},
     r"RANK=1 contradicts OMPI_COMM_WORLD_RANK=0 in the same world "
     r"\(WORLD_SIZE=2, OMPI_COMM_WORLD_SIZE=2\)"),
    ("WORLD_SIZE vs srun's SLURM_NTASKS", {"RANK": "1", "WORLD_SIZE": "4", "SLURM_PROCID": "1",
                                           "SLURM_NTASKS": "8", **SRUN, **MASTER},
     "WORLD_SIZE=4 contradicts SLURM_NTASKS=8"),
    ("srun vs PMIx", {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "PMIX_RANK": "1", **SRUN},
     "SLURM_PROCID=0 contradicts PMIX_RANK=1"),
    ("indexed job vs PET_NODE_RANK", {"JOB_COMPLETION_INDEX": "0", "PET_NNODES": "2",
                                      "PET_NODE_RANK": "1", **MASTER},
     "JOB_COMPLETION_INDEX=0 contradicts PET_NODE_RANK=1"),
    ("Horovod vs Open MPI", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2",
                             "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},
     "HOROVOD_RANK=0 contradicts OMPI_COMM_WORLD_RANK=1"),
    # half-set: a rank without a world, a world without a rank, a world without a master
    ("RANK alone", {"RANK": "1", **MASTER}, "RANK=1 is set but WORLD_SIZE is not"),
    ("HOROVOD_RANK alone", {"HOROVOD_RANK": "1"}, "HOROVOD_RANK=1 is set but HOROVOD_SIZE"),
    ("PMIX_RANK alone", {"PMIX_RANK": "1"}, "PMIX_RANK=1 is set but WORLD_SIZE is not"),
    ("index without a world", {"JOB_COMPLETION_INDEX": "3"},
     r"JOB_COMPLETION_INDEX=3 is set but WORLD_SIZE \(or PET_NNODES\) is not"),
    ("PET_NODE_RANK without PET_NNODES", {"PET_NODE_RANK": "0"},
     "PET_NODE_RANK=0 is set but PET_NNODES is not"),
    ("WORLD_SIZE alone", {"WORLD_SIZE": "2", **MASTER}, "WORLD_SIZE=2 but no rank: set RANK"),
    ("index without a master", {"JOB_COMPLETION_INDEX": "1", "WORLD_SIZE": "2"},
     r"MASTER_ADDR and MASTER_PORT are not set for rank 1 of 2 \(from JOB_COMPLETION_INDEX/"),
    # several processes per node were asked for, but nobody started them
    ("PET nproc 2 without a launcher", {"PET_NNODES": "1", "PET_NPROC_PER_NODE": "2",
                                        "PET_NODE_RANK": "0"},
     "PET_NPROC_PER_NODE=2 asks for 2 processes on this node but RANK is not set"),
    ("elastic PET_NNODES", {"PET_NNODES": "1:4", "PET_NODE_RANK": "0"}, "PET_NNODES='1:4'"),
    ("Horovod cross rank", {"HOROVOD_RANK": "0", "HOROVOD_SIZE": "2", "HOROVOD_CROSS_RANK": "2",
                            "HOROVOD_CROSS_SIZE": "2"},
     r"HOROVOD_CROSS_RANK=2 is outside \[0, HOROVOD_CROSS_SIZE=2\)"),
]


@pytest.mark.parametrize("env, message", [r[1:] for r in FAILING], ids=[r[0] for r in FAILING])
def test_contradictory_and_half_set_environments_name_the_variables(env, message):
    with pytest.raises(ValueError, match=message):
        resolve(environ=env)


def test_slurm_port_is_the_jobs_own_and_stays_below_ephemeral_ports():
    ports = {slurm_port({"SLURM_JOB_ID": str(job)}) for job in range(100000, 100050)}
    assert len(ports) == 50 and all(15000 <= p < 32768 for p in ports)
    assert slurm_port({"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "1"}) != slurm_port(
        {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0"})
    assert slurm_port({}) is None
    # an explicit MASTER_PORT still wins
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "MASTER_PORT": "1234", **SRUN}
    assert resolve(environ=env).master_port == 1234
