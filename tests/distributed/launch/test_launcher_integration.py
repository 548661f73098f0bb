"""The launcher with the real process group: ranks rendezvous through the environment it sets,
all-reduce, and a failed attempt is restarted on the same master port."""
from __future__ import annotations

import pytest

try:
    from launcher_support import free_port, job  # noqa: F401  (fixture)
except ImportError:  # the tests directory imported as a package
    from tests.launcher_support import free_port, job  # noqa: F401

pytestmark = pytest.mark.timeout(180)

TRAIN = """
import numpy as np
import neural_arch.distributed as dist

dist.init_process_group(backend=os.environ["NEURAL_ARCH_BACKEND"], timeout=60)
values = np.full(5, RANK + 1.0, dtype=np.float64)
dist.all_reduce(values)
if RANK == 1 and ATTEMPT == 0:
    sys.exit(7)  # leaves the job; the launcher restarts everyone
print(f"sum {values[0]:.0f} world {dist.get_world_size()} attempt {ATTEMPT}")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_restarted_job_all_reduces_across_ranks(job, backend):
    nproc = 3
    script = job.script(TRAIN)
    result = job.run(script, f"--nproc_per_node={nproc}", f"--backend={backend}",
                     f"--master_port={free_port()}", "--max_restarts=1", timeout=150)
    assert result.returncode == 0, result.stderr
    expected_sum = nproc * (nproc + 1) // 2  # ranks contribute 1, 2, ..., nproc
    lines = sorted(line for line in result.stdout.splitlines() if line.endswith("attempt 1"))
    assert lines == [f"[rank {r}] sum {expected_sum} world {nproc} attempt 1"
                     for r in range(nproc)]
    assert f"[rank 0] sum {expected_sum} world {nproc} attempt 0" in result.stdout.splitlines()
    assert "rank 1 failed with exit code 7; restarting all 3 workers" in result.stderr
