"""Shared test configuration: import paths and the list of installed distributed backends."""
from __future__ import annotations

import os
import sys

import pytest

# The test files live in subfolders that mirror the package (tests/core, tests/distributed/ddp,
# ...) and import the helpers kept here by bare name (dist_harness, shm_testing, ddp_cases, ...).
# pytest's default "prepend" import mode puts only each test file's own folder on sys.path, so
# this folder goes at the front here, whatever the import mode; the repository root too, for the
# package. Child processes inherit the search path (fork, forkserver; mpiexec via dist_harness).
_TESTS = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(_TESTS), _TESTS):
    if path not in sys.path:
        sys.path.insert(0, path)

from dist_harness import installed_backends  # noqa: E402

# The tests place their tensors themselves; a shell's default device would move them.
os.environ.pop("NEURAL_ARCH_DEVICE", None)
# Open MPI's libfabric transport (btl ofi) looks for network fabrics at every MPI_Init: about a
# second each time on a machine without one (an mpiexec of two ranks 1.3 s with it, 0.3 s
# without). Every MPI job of the tests runs on this one host, where shared memory serves; the
# jobs the tests start inherit this.
os.environ.setdefault("OMPI_MCA_btl", "^ofi")

BACKENDS = installed_backends()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Every distributed backend this installation can run (shm, tcp, and mpi with mpiexec)."""
    return request.param


@pytest.fixture
def one_rank_group(monkeypatch):
    """This process as the whole job, one rank (no launcher variables leak in from the shell)."""
    from neural_arch import distributed as dist
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    dist.init_process_group("gloo", world_size=1, rank=0, timeout=10)
    yield
    dist.destroy_process_group()
