"""Sleeping in the kernel on a word of shared memory until another process changes it.

Linux's futex system call, reached through ctypes: ``wait(address, expected, timeout)`` sleeps
while the 32-bit word at ``address`` still holds ``expected`` (the kernel checks this, so a
change made just before the call is never slept through), and ``wake(address)`` wakes every
process sleeping on it. The operations are the shared (not process-private) ones, so processes
that map the same segment wake each other.

``AVAILABLE`` is False where there is no futex (not Linux, an unknown CPU, a big-endian one);
callers then poll and sleep instead.
"""
from __future__ import annotations

import ctypes
import platform
import sys

_SYSCALL_NUMBERS = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}
_FUTEX_WAIT, _FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _find_syscall():
    if not sys.platform.startswith("linux") or sys.byteorder != "little":
        return None, None
    number = _SYSCALL_NUMBERS.get(platform.machine().lower())
    if number is None:
        return None, None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.syscall, number
    except (OSError, AttributeError):
        return None, None


_syscall, _SYS_FUTEX = _find_syscall()
AVAILABLE = _syscall is not None


def wait(address: int, expected: int, timeout: float) -> None:
    """Sleep while the 32-bit word at ``address`` equals ``expected`` (its low 32 bits), at
    most ``timeout`` seconds; may also return early (a signal, a spurious wake-up)."""
    seconds = max(0.0, timeout)
    spec = _Timespec(int(seconds), int((seconds % 1.0) * 1e9))
    _syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAIT),
             ctypes.c_uint32(expected & 0xFFFFFFFF), ctypes.byref(spec), None, ctypes.c_int(0))


def wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    _syscall(ctypes.c_long(_SYS_FUTEX), ctypes.c_void_p(address), ctypes.c_int(_FUTEX_WAKE),
             ctypes.c_int(_WAKE_ALL), None, None, ctypes.c_int(0))
