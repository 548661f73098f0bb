"""The ``leftovers`` fixture: a test module that imports it (``from leftovers_fixture import
leftovers  # noqa: F401``) fails any of its tests that leaves a process it started alive, or a
/dev/shm segment such a process created, and removes what was left so that one failure does not
spill into the next test. ``tests/faults/conftest.py`` applies it to every fault test."""
from __future__ import annotations

import pytest

from leftovers import Leftovers


@pytest.fixture(autouse=True)
def leftovers():
    """Watches the processes the test starts; afterwards fails the test if any is still alive or
    left a segment in /dev/shm (and removes them). A test names processes the watch cannot see
    (outside this process tree) with ``leftovers.add(pids)``."""
    watch = Leftovers()
    yield watch
    processes, segments = watch.check()
    watch.remove(processes, segments)
    assert (processes, segments) == ([], []), "left behind: processes, /dev/shm segments"
