"""The IDX file format (MNIST and friends): a reader and an ``MNIST`` dataset over real files."""
from __future__ import annotations

import gzip
import os
import struct
from typing import Union

import numpy as np

from .dataset import TensorDataset

PathLike = Union[str, "os.PathLike[str]"]

# IDX type codes -> big-endian NumPy dtypes.
IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_GZIP_MAGIC = b"\x1f\x8b"


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (raw, or gzip-compressed) into an array of native byte order.

    Raises ``ValueError`` naming the file for a bad magic number, an unknown type code, a
    truncated header, or a payload whose size does not match the dimensions.
    """
    with open(path, "rb") as handle:
        raw = handle.read()
    if raw[:2] == _GZIP_MAGIC:
        raw = gzip.decompress(raw)
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes is too short for an IDX header")
    zero_a, zero_b, code, ndim = raw[:4]
    if zero_a != 0 or zero_b != 0:
        raise ValueError(f"{path}: bad IDX magic number 0x{raw[:4].hex()} (must start with 0x0000)")
    if code not in IDX_DTYPES:
        known = ", ".join(f"0x{c:02x}" for c in IDX_DTYPES)
        raise ValueError(f"{path}: unknown IDX type code 0x{code:02x} (known: {known})")
    if ndim == 0:
        raise ValueError(f"{path}: IDX header declares 0 dimensions")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: header declares {ndim} dimensions but the file has only "
                         f"{len(raw)} bytes")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(IDX_DTYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(f"{path}: dimensions {dims} of {dtype.name} need {expected} data bytes, "
                         f"the file has {len(raw) - header}")
    array = np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims)
    return array.astype(dtype.newbyteorder("="))


def _find(root: PathLike, name: str) -> str:
    candidates = [os.path.join(folder, name + suffix)
                  for folder in (root, os.path.join(root, "MNIST", "raw"))
                  for suffix in ("", ".gz")]
    for candidate in candidates:
        if os.path.isfile(candidate):
            return candidate
    raise FileNotFoundError(f"MNIST file {name}[.gz] not found; looked for {candidates}")


class MNIST(TensorDataset):
    """MNIST (or any IDX image/label pair in its layout) read from ``root``.

    ``root`` holds ``train-images-idx3-ubyte`` / ``train-labels-idx1-ubyte`` (or the ``t10k``
    pair for ``train=False``), raw or ``.gz``, directly or under ``MNIST/raw``. Items are
    (float32 image scaled to [0, 1], int64 label); images are flattened to vectors (ready for
    ``MLP([784, ...])``) unless ``flatten=False``, which gives ``(1, rows, cols)``.
    ``.data`` keeps the uint8 images and ``.targets`` the labels.
    """

    def __init__(self, root: PathLike, train: bool = True, flatten: bool = True) -> None:
        prefix = "train" if train else "t10k"
        images_path = _find(root, f"{prefix}-images-idx3-ubyte")
        labels_path = _find(root, f"{prefix}-labels-idx1-ubyte")
        images, labels = read_idx(images_path), read_idx(labels_path)
        if images.ndim != 3 or images.dtype != np.uint8:
            raise ValueError(f"{images_path}: expected uint8 images of shape (N, rows, cols), got "
                             f"{images.dtype} {images.shape}")
        if labels.ndim != 1:
            raise ValueError(f"{labels_path}: expected labels of shape (N,), got {labels.shape}")
        if len(images) != len(labels):
            raise ValueError(f"{images_path} has {len(images)} images but {labels_path} has "
                             f"{len(labels)} labels")
        self.data, self.targets = images, labels.astype(np.int64)
        scaled = images.astype(np.float32) / np.float32(255.0)
        shape = (len(images), -1) if flatten else (len(images), 1) + images.shape[1:]
        super().__init__(scaled.reshape(shape), self.targets)
