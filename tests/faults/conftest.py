"""Every fault test ends with nothing left: no process it started, no shared-memory segment."""
from __future__ import annotations

from leftovers_fixture import leftovers  # noqa: F401 - nothing outlives a test

