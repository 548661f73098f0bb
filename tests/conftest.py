"""Shared test configuration: import paths and the list of installed distributed backends."""
from __future__ import annotations

import os
import sys

import pytest

_TESTS = os.path.dirname(os.path.abspath(__file__))
for path in (os.path.dirname(_TESTS), _TESTS):  # the package, and test modules such as dist_harness
    if path not in sys.path:
        sys.path.insert(0, path)

from dist_harness import installed_backends  # noqa: E402

# The tests place their tensors themselves; a shell's default device would move them.
os.environ.pop("NEURAL_ARCH_DEVICE", None)

BACKENDS = installed_backends()


@pytest.fixture(params=BACKENDS)
def backend(request) -> str:
    """Every distributed backend this installation can run (shm, tcp, and mpi with mpiexec)."""
    return request.param
