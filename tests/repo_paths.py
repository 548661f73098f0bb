"""Where the repository and this folder are, for tests in any subfolder of ``tests/``: the
repository root (the package, examples, benchmarks and scripts) and ``tests/`` itself (the
shared helpers, the ``*_job.py`` scripts and ``cuda_host_emulation.h``)."""
from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parent
REPO_ROOT = TESTS_DIR.parent
