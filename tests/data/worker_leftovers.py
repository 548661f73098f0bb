"""The ``leftovers`` fixture of the DataLoader worker tests: a test module that imports it
(``from worker_leftovers import leftovers  # noqa: F401``) fails any of its tests that ends with
a worker process alive or a /dev/shm segment of one, and removes them. It looks every 0.05 s,
not the shared fixture's 0.2 s: a process is watched only once seen below this one, and a worker
may stay there briefly (a loader's main process that dies orphans its workers)."""
import pytest

from leftovers import Leftovers


@pytest.fixture(autouse=True)
def leftovers():
    """Every test ends with no worker process left."""
    watch = Leftovers(period=0.05)
    yield watch
    processes, segments = watch.check()
    watch.remove(processes, segments)
    assert (processes, segments) == ([], []), "left behind: processes, /dev/shm segments"
