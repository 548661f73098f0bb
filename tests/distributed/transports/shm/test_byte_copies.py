"""``byte_copies.copy_bytes``: one memcpy of a count of bytes, so it takes only 1-D C-contiguous
uint8 arrays, and writes only a writable one: with wider elements or strides the count would run
past the arrays."""
from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba", reason="the compiled copies need Numba")
from numba.core.errors import TypingError  # noqa: E402

from neural_arch.distributed.transports.shm import byte_copies  # noqa: E402

pytestmark = pytest.mark.timeout(60)


@numba.njit
def copy(dst, dst_start, src, src_start, count):
    byte_copies.copy_bytes(dst, dst_start, src, src_start, count)


def test_copies_the_bytes_asked_for():
    src = np.arange(1000, dtype=np.int64).astype(np.uint8)
    dst = np.zeros(1000, np.uint8)
    copy(dst, 7, src, 3, 900)
    expected = np.zeros(1000, np.uint8)
    expected[7:907] = src[3:903]
    assert dst.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dst,src", [
    (np.zeros(8, np.float32), np.zeros(8, np.float32)),  # elements of 4 bytes
    (np.zeros(8, np.uint8), np.zeros(8, np.int32)),
    (np.zeros(16, np.uint8)[::2], np.zeros(8, np.uint8)),  # strided
    (np.zeros((2, 4), np.uint8), np.zeros(8, np.uint8)),  # 2-D
    (np.frombuffer(bytes(8), np.uint8), np.zeros(8, np.uint8)),  # read-only destination
], ids=["float32", "int32-source", "strided", "2-D", "read-only"])
def test_refuses_anything_but_contiguous_bytes(dst, src):
    before = dst.copy()
    with pytest.raises(TypingError):
        copy(dst, 0, src, 0, 4)
    assert dst.tobytes() == before.tobytes()
