"""Fixtures the shared-memory transport's tests share."""
from __future__ import annotations

import pytest

from neural_arch.distributed.transports.shm import tuning


@pytest.fixture
def built_in_table(tmp_path, monkeypatch):
    """An empty tuning table for any machine, named by ``NEURAL_ARCH_SHM_TUNING``: every size
    takes the built-in choice in this process and in the ranks forked from it (the package's
    table for this machine may choose otherwise)."""
    path = tmp_path / "built_in.json"
    path.write_text('{"format": 1, "all_reduce": {}}')
    monkeypatch.setenv(tuning.ENV_TABLE, str(path))
    tuning.forget()
    yield str(path)
    tuning.forget()
