"""Reading a file of ``save`` back without trusting it, in bounded time and memory.

A path must name a regular file: a device, a FIFO or a directory is refused before anything
is read from it. The header is at most ``MAX_HEADER`` bytes and every field of it is checked;
arrays are read exactly as far as the header declares, never past the end of a file whose size
is known (a path, a regular file object, an in-memory buffer), and a stream of unknown length
(a pipe) is read only as far as its header declares, as its bytes arrive.
"""
from __future__ import annotations

import errno
import hashlib
import math
import os
import stat
import sys
from typing import Any, BinaryIO, Callable, Dict, List, Optional, Tuple

import numpy as np

from ..core.bfloat16 import BFLOAT16, MISSING_MESSAGE, is_bfloat16
from .fileformat import (BLANK_DIGEST, DIGEST_FIELD, DIGEST_KEY, FORMAT_KEY, FORMAT_VERSION,
                         MAX_HEADER, METADATA_KEYS, STRUCTURE_KEY, damaged, not_ours)
from .structure import parse_json, short

_CHUNK = 16 * 2 ** 20  # a stream of unknown length is read this much at a time
_MAX_DIMS = 32  # NumPy 1's limit
_DTYPES = {"BOOL": "?", "U8": "u1", "I8": "i1", "U16": "<u2", "I16": "<i2", "U32": "<u4",
           "I32": "<i4", "U64": "<u8", "I64": "<i8", "F16": "<f2", "F32": "<f4", "F64": "<f8",
           "BF16": "<u2"}  # bfloat16: its 16 bits, read as ml_dtypes' bfloat16 (``_array``)
_ENTRY_KEYS = {"dtype", "shape", "data_offsets"}
_HEX = frozenset("0123456789abcdef")
# (offset of its first byte in the data, of the byte after its last, name, dtype, shape)
Entry = Tuple[int, int, str, np.dtype, Tuple[int, ...]]


def open_regular(path: str, name: str) -> BinaryIO:
    """``path`` opened for reading; ValueError when it is no regular file."""
    try:
        _require_regular(os.stat(path).st_mode, path, name)
    except FileNotFoundError:
        raise FileNotFoundError(f"load: no file at {path!r}") from None
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        raise ValueError(f"load: {name} is not a regular file: it is a loop of symbolic "
                         f"links") from None
    # O_NONBLOCK: should a FIFO take the file's place after the check, opening it cannot wait.
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    stream = open(fd, "rb", buffering=0)
    try:
        _require_regular(os.fstat(fd).st_mode, path, name)
    except ValueError:
        stream.close()
        raise
    return stream


def _require_regular(mode: int, path: str, name: str) -> None:
    if stat.S_ISREG(mode):
        return
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    kind = next((what for test, what in kinds if test(mode)), f"of file type {mode:o}")
    link = f" (a link to {os.path.realpath(path)!r})" if os.path.islink(path) else ""
    raise ValueError(f"load: {name} is not a regular file: it is {kind}{link}; load reads "
                     f"files written by neural_arch.save")


def stream_size(f: Any) -> Optional[int]:
    """The bytes left in a file object when it can tell (a regular file, an in-memory
    buffer); None for a pipe, a socket, a device or an object that does not say."""
    try:
        if hasattr(f, "getbuffer"):
            with f.getbuffer() as view:
                return max(0, view.nbytes - f.tell())
        info = os.fstat(f.fileno())
        return max(0, info.st_size - f.tell()) if stat.S_ISREG(info.st_mode) else None
    except (AttributeError, OSError, ValueError):
        return None


def binary_reader(f: Any, name: str) -> Callable[[int], bytes]:
    """``f.read``, checked: bytes, and never more than asked for."""
    def read(count: int) -> bytes:
        chunk = f.read(count)
        if chunk is None:  # a non-blocking stream with nothing ready
            return b""
        if not isinstance(chunk, (bytes, bytearray, memoryview)):
            raise TypeError(f"load: {name} gave a {type(chunk).__name__} from read(); load "
                            f"reads a file object opened in binary mode ('rb')")
        if len(chunk) > count:
            raise ValueError(f"load: {name} gave {len(chunk)} bytes from read({count})")
        return chunk
    return read


def _read_up_to(read: Callable[[int], bytes], count: int, known: bool) -> bytearray:
    """Up to ``count`` bytes, fewer only at the end of the stream. ``known``: the stream is
    known to hold them, so the buffer is made whole at once (no copies as it grows)."""
    if not known:
        buffer = bytearray()
        while len(buffer) < count:
            chunk = read(min(_CHUNK, count - len(buffer)))
            if not chunk:
                break
            buffer += chunk
        return buffer
    buffer, filled = bytearray(count), 0
    with memoryview(buffer) as view:
        while filled < count:
            chunk = read(min(_CHUNK, count - filled))
            if not chunk:
                break
            view[filled:filled + len(chunk)] = chunk
            filled += len(chunk)
    del buffer[filled:]
    return buffer


def read_file(read: Callable[[int], bytes], name: str, size: Optional[int],
              exact: bool) -> Tuple[str, Dict[str, np.ndarray]]:
    """The structure JSON and the arrays of the file that ``read`` gives. ``size``: the bytes
    left in the stream when known; ``exact``: they must all belong to the file (a path)."""
    first = bytes(_read_up_to(read, 8, known=False))
    if len(first) < 8:
        raise not_ours(name, f"it has {len(first)} bytes, fewer than a safetensors header needs")
    length = int.from_bytes(first, "little")
    if length > MAX_HEADER or (size is not None and length > size - 8):
        if first.startswith(b"PK\x03\x04"):
            raise not_ours(name, "it is a zip archive, as torch.save writes")
        if first[:1] == b"\x80" and first[1:2] in b"\x02\x03\x04\x05":
            raise not_ours(name, "it starts like a pickle")
        limit = (f"in a {size}-byte file" if size is not None and length > size - 8 else
                 f"over the {MAX_HEADER} bytes safetensors allows")
        raise not_ours(name, f"its first 8 bytes announce a {length}-byte header {limit}")
    raw = bytes(_read_up_to(read, length, known=size is not None))
    if len(raw) < length:
        raise not_ours(name, f"its first 8 bytes announce a {length}-byte header, but only "
                             f"{len(raw)} bytes follow")
    header, metadata = _header(raw, name)
    entries, data_size = _table(header, name)
    if size is not None:
        held = size - 8 - length
        if held < data_size:
            raise damaged(name, f"it ends after {held} bytes of arrays, where its header "
                                f"declares {data_size}")
        if exact and held > data_size:
            raise damaged(name, f"it has {held - data_size} bytes more than the {data_size} "
                                f"bytes of arrays its header declares")
    digest = _digest_start(first, raw, metadata, name)
    buffers, got = [], 0
    for begin, end, _, _, _ in entries:
        buffer = _read_up_to(read, end - begin, known=size is not None)
        got += len(buffer)
        if len(buffer) < end - begin:
            raise damaged(name, f"it ends after {got} bytes of arrays, where its header "
                                f"declares {data_size}")
        if digest is not None:
            digest.update(buffer)
        buffers.append(buffer)
    if digest is not None and digest.hexdigest() != metadata[DIGEST_KEY]:
        raise damaged(name, "its contents do not match the digest save wrote into it: bytes "
                            "were changed after it was saved")
    arrays = {key: _array(buffer, key, dtype, shape, name)
              for (_, _, key, dtype, shape), buffer in zip(entries, buffers)}
    return metadata[STRUCTURE_KEY], arrays


def _header(raw: bytes, name: str) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """The header's array entries and its metadata, after checking the file is one of ours."""
    try:
        header = parse_json(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError too
        raise not_ours(name, f"its header is not safetensors JSON: {exc}") from None
    if type(header) is not dict:
        raise not_ours(name, f"its header is a JSON {type(header).__name__}, not an object")
    metadata = header.pop("__metadata__", {})
    if type(metadata) is not dict:
        raise not_ours(name, f"its __metadata__ is a {type(metadata).__name__}, not an object")
    if metadata.get(FORMAT_KEY) != FORMAT_VERSION:
        raise not_ours(name, f"its metadata has {FORMAT_KEY}={short(metadata.get(FORMAT_KEY))}, "
                             f"expected {FORMAT_VERSION!r}")
    unknown = sorted(set(metadata) - set(METADATA_KEYS))
    if unknown:
        raise damaged(name, f"its metadata has keys save does not write: {short(unknown)}")
    if STRUCTURE_KEY not in metadata:
        raise damaged(name, f"its metadata has no {STRUCTURE_KEY}")
    for key, value in metadata.items():
        if type(value) is not str:
            raise damaged(name, f"its metadata {key} is {type(value).__name__} {short(value)}, "
                                f"not a string")
    return header, metadata


def _table(header: Dict[str, Any], name: str) -> Tuple[List[Entry], int]:
    """The array entries in the order of their bytes, and the size of all of them: each
    entry checked, the arrays one after another from the start of the data."""
    entries = []
    for key, entry in header.items():
        what = f"its array {short(key)}"
        if type(entry) is not dict or set(entry) != _ENTRY_KEYS:
            raise damaged(name, f"{what} is {short(entry)}, not an object with the keys "
                                f"dtype, shape and data_offsets")
        kind, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
        if type(kind) is not str or kind not in _DTYPES:
            raise damaged(name, f"{what} has the dtype {short(kind)}; save writes "
                                f"{', '.join(_DTYPES)}")
        if not (type(shape) is list and len(shape) <= _MAX_DIMS
                and all(type(n) is int and n >= 0 for n in shape)):
            raise damaged(name, f"{what} has the shape {short(shape)}, not a list of at most "
                                f"{_MAX_DIMS} sizes of 0 or more")
        if not (type(offsets) is list and len(offsets) == 2
                and all(type(n) is int for n in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise damaged(name, f"{what} has the data_offsets {short(offsets)}, not [begin, "
                                f"end] with 0 <= begin <= end")
        dtype = np.dtype(_DTYPES[kind])
        size = math.prod(shape) * dtype.itemsize
        if offsets[1] - offsets[0] != size or size > sys.maxsize:
            raise damaged(name, f"{what} of dtype {kind} and shape {short(shape)} needs {size} "
                                f"bytes, its data_offsets {short(offsets)} hold "
                                f"{offsets[1] - offsets[0]}")
        if kind == "BF16":
            if BFLOAT16 is None:  # refused before its bytes are read
                raise RuntimeError(f"load: {name} holds bfloat16 arrays ({what}); "
                                   f"{MISSING_MESSAGE}")
            dtype = BFLOAT16
        entries.append((offsets[0], offsets[1], key, dtype, tuple(shape)))
    entries.sort(key=lambda e: (e[0], e[1]))
    position = 0
    for begin, end, key, _, _ in entries:
        if begin != position:
            raise damaged(name, f"its array {short(key)} starts at byte {begin} of the data, "
                                f"where the array before it ends at {position}")
        position = end
    return entries, position


def _digest_start(first: bytes, raw: bytes, metadata: Dict[str, str], name: str) -> Any:
    """A SHA-256 fed with the file up to its arrays as save hashed it (its digest blanked);
    None for a file saved before digests were written."""
    digest = metadata.get(DIGEST_KEY)
    if digest is None:
        return None
    field = raw.find(DIGEST_FIELD + digest.encode() + b'"')
    if len(digest) != 64 or not _HEX.issuperset(digest) or field < 0:
        raise damaged(name, f"its {DIGEST_KEY} {short(digest)} is not 64 hex digits written "
                            f"as save writes them")
    at = field + len(DIGEST_FIELD)
    hasher = hashlib.sha256(first)
    hasher.update(raw[:at])
    hasher.update(BLANK_DIGEST)
    hasher.update(raw[at + 64:])
    return hasher


def _array(buffer: bytearray, key: str, dtype: np.dtype, shape: Tuple[int, ...],
           name: str) -> np.ndarray:
    if is_bfloat16(dtype):  # little-endian 16-bit patterns, in the machine's order, viewed
        bits = np.frombuffer(buffer, dtype="<u2")
        return bits.astype("=u2", copy=False).view(dtype).reshape(shape)
    array = np.frombuffer(buffer, dtype=dtype).reshape(shape)  # writable: a bytearray's
    if dtype.kind == "b" and buffer.count(0) + buffer.count(1) != len(buffer):
        raise damaged(name, f"its bool array {short(key)} holds bytes other than 0 and 1")
    return array if dtype.isnative else array.astype(dtype.newbyteorder("="))
