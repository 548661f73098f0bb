"""``benchmarks/bench_serve.py`` runs end to end on a short load and prints its tables: the
closed loop's capacity and gain, the open loop against the bound and its PASS/MISS line."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

pytest.importorskip("starlette", reason="the serve extra is not installed")
pytest.importorskip("uvicorn", reason="the serve extra is not installed")

from leftovers_fixture import leftovers  # noqa: F401,E402
from serve_support import REPO_ROOT  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@pytest.mark.slow
def test_the_load_test_reports_each_max_batch_and_the_gain():
    result = subprocess.run(
        [sys.executable, "benchmarks/bench_serve.py", "--batch-sizes", "1", "4", "--clients",
         "4", "--seconds", "0.5", "--warmup", "0.2", "--d-token", "8", "--loads", "0.5"],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=50)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| (\d+) \|", result.stdout, re.M)
    assert [size for size, _ in rows] == ["1", "4"], result.stdout
    assert all(int(rate) > 0 for _, rate in rows), result.stdout
    assert "throughput gain of max batch 4 over 1:" in result.stdout
    # the open loop at half of max batch 4's rows/s, against the bound, with its verdict
    assert re.search(r"^\| 4 \| 0\.5 \| \d+ \|", result.stdout, re.M), result.stdout
    assert re.search(r"^(PASS|MISS): batcher p99 <= timeout \+ 2C at load 0\.5 \(max batch 4: ",
                     result.stdout, re.M), result.stdout
