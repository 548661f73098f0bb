"""Skip markers of the tests that need a GPU (CuPy and a CUDA device) or the shm transport,
shared by ``test_gpu_collectives`` and ``test_ddp_devices``."""
from __future__ import annotations

import pytest

from neural_arch.distributed import transports


def _gpu_count() -> int:
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no CuPy, or no driver
        return 0


GPUS = _gpu_count()
needs_gpu = pytest.mark.skipif(GPUS == 0, reason="needs CuPy and a CUDA device")
needs_shm = pytest.mark.skipif("shm" not in transports.available_transports(),
                               reason="the shm transport is not available here")
