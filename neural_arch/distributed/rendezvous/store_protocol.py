"""The store's wire format: request and response frames, their hard caps, and their decoders.

No pickle. After the handshake in ``auth``, each request is a fixed 21-byte header
``<op u8, key length u32, value length u64, timeout f64>`` followed by the key and the value;
each response is ``<status u8, length u64>`` and a payload. Lengths are checked against hard caps
before anything is allocated, so a hostile or broken peer cannot make the reader allocate much.
"""
from __future__ import annotations

import socket
import struct
from typing import Callable, Iterable, NamedTuple

MAX_KEY_BYTES = 4096
DEFAULT_MAX_VALUE_BYTES = 64 << 20
MAX_TIMEOUT_S = 1e7
_REQUEST = struct.Struct("<BIQd")
_RESPONSE = struct.Struct("<BQ")
_LEN = struct.Struct("<I")
SET, GET, ADD, CHECK, DELETE, WAIT = range(1, 7)
_OP_NAMES = {SET: "set", GET: "get", ADD: "add", CHECK: "check", DELETE: "delete_key", WAIT: "wait"}
_OK, _TIMEOUT, _ERROR = 0, 1, 2


class FrameError(ValueError):
    """Bytes on the wire that are not a well-formed store frame."""


class Request(NamedTuple):
    op: int
    key: bytes
    value: bytes
    timeout: float


def encode_keys(keys: Iterable[bytes]) -> bytes:
    return b"".join(_LEN.pack(len(k)) + k for k in keys)


def decode_keys(blob: bytes) -> list[bytes]:
    keys, pos = [], 0
    while pos < len(blob):
        if pos + _LEN.size > len(blob):
            raise FrameError(f"key list truncated at byte {pos} of {len(blob)}")
        (n,) = _LEN.unpack_from(blob, pos)
        pos += _LEN.size
        if n > MAX_KEY_BYTES or pos + n > len(blob):
            raise FrameError(f"key of {n} bytes at byte {pos} of a {len(blob)}-byte key list")
        keys.append(bytes(blob[pos:pos + n]))
        pos += n
    return keys


def encode_request(op: int, key: bytes = b"", value: bytes = b"", timeout: float = 0.0) -> bytes:
    return _REQUEST.pack(op, len(key), len(value), timeout) + key + value


def read_request(read_exact: Callable[[int], bytes],
                 max_value: int = DEFAULT_MAX_VALUE_BYTES) -> Request:
    """Decode one request; ``read_exact(n)`` is only ever asked for a length within the caps.

    Raises FrameError on malformed input (and whatever ``read_exact`` raises on a short read).
    """
    op, key_len, value_len, timeout = _REQUEST.unpack(read_exact(_REQUEST.size))
    if op not in _OP_NAMES:
        raise FrameError(f"unknown store operation {op}")
    if key_len > MAX_KEY_BYTES:
        raise FrameError(f"key of {key_len} bytes exceeds the {MAX_KEY_BYTES}-byte limit")
    if value_len > max_value:
        raise FrameError(f"value of {value_len} bytes exceeds the {max_value}-byte limit")
    if not 0.0 <= timeout <= MAX_TIMEOUT_S:  # also rejects NaN
        raise FrameError(f"timeout {timeout} is outside [0, {MAX_TIMEOUT_S}]")
    key = read_exact(key_len) if key_len else b""
    value = read_exact(value_len) if value_len else b""
    if op in (CHECK, WAIT):
        decode_keys(value)
    elif op == ADD and len(value) != 8:
        raise FrameError(f"add carries an 8-byte amount, got {len(value)} bytes")
    return Request(op, key, value, timeout)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view, got = memoryview(buf), 0
    while got < n:
        k = sock.recv_into(view[got:])
        if k == 0:
            raise EOFError(f"connection closed after {got} of {n} bytes")
        got += k
    return bytes(buf)
