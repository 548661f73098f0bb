"""Whether reading a peer's memory through the kernel pays on this machine: a timing at set-up.

Peer reads (``single_copy``) replace the all-reduce's two copies through the shared workspace
(each rank copies its vector in, then reads both operands and writes the sum) by one read
through the kernel (``process_vm_readv``) and half the sum's traffic. By that count they win
while a read costs less than about 1.75 copies of the same bytes, and on the machines measured
they lost by more than the count says: a 2-core AMD EPYC machine read at 3.3-4.1x a copy's
time (the tuner prints it) and its peer-read all-reduce took 1.3-4.2x the workspace's time; a
2-core Xeon's peer reads took 0.60-0.82x it from 256 KiB (by the count, a read there costs
about one copy). So the built-in choice (``tuning.default_choice``) takes peer reads only
where every rank's read costs at most PAYS_MAX_RATIO copies: the count's break-even.

``ratio(read)`` times a read of PROBE_BYTES of this process's own memory (the kernel's path and
page pinning are a peer's) against a NumPy copy of the same bytes, the best of TRIES tries in
each of BUFFERS fresh pairs of buffers, read and copy taking turns at going first. On a virtual
machine some allocations copied several times slower than others for every try: the best over
several allocations is the machine's.
"""
from __future__ import annotations

import os
import time
from typing import Callable, Optional

import numpy as np

PROBE_BYTES = 256 << 10
TRIES = 3
BUFFERS = 3
PAYS_MAX_RATIO = 1.75

# ``read(pid, remote_address, local_address, nbytes)``: the bytes moved, as process_vm_readv
Read = Callable[[int, int, int, int], int]


def ratio(read: Read) -> Optional[float]:
    """The best read's time over the best copy's (see the module docstring); None where a
    read moved fewer bytes than asked (the kernel refused)."""
    best_read = best_copy = float("inf")
    pid = os.getpid()
    for _ in range(BUFFERS):
        source = np.ones(PROBE_BYTES, np.uint8)
        target = np.ones_like(source)
        if read(pid, source.ctypes.data, target.ctypes.data, source.nbytes) != source.nbytes:
            return None  # the untimed first read also pins, faults and warms what it touches
        np.copyto(target, source)
        for turn in range(2 * TRIES):
            start = time.perf_counter()
            if turn % 2:
                np.copyto(target, source)
                best_copy = min(best_copy, time.perf_counter() - start)
            else:
                moved = read(pid, source.ctypes.data, target.ctypes.data, source.nbytes)
                best_read = min(best_read, time.perf_counter() - start)
                if moved != source.nbytes:
                    return None
    return best_read / max(best_copy, 1e-9)


def pays(read: Read) -> bool:
    """Whether a read through the kernel costs at most PAYS_MAX_RATIO copies here."""
    found = ratio(read)
    return found is not None and found <= PAYS_MAX_RATIO
