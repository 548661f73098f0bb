"""Every fault test ends with nothing left: no process it started, no shared-memory segment."""
from __future__ import annotations

import pytest

from leftovers import Leftovers


@pytest.fixture(autouse=True)
def leftovers():
    """Watches the processes the test starts; afterwards fails the test if any is still alive or
    left a segment in /dev/shm (and removes them, so the next test starts clean). A test names
    processes the watch cannot see (outside this process tree) with ``leftovers.add(pids)``."""
    watch = Leftovers()
    yield watch
    processes, segments = watch.check()
    watch.remove(processes, segments)
    assert (processes, segments) == ([], []), "left behind: processes, /dev/shm segments"
