"""IDX/MNIST reading on files written here, and CharDataset from text and files."""
import gzip
import struct

import numpy as np
import pytest

from neural_arch.data import MNIST, CharDataset, read_idx

pytestmark = pytest.mark.timeout(60)

CODES = {np.dtype(np.uint8): 0x08, np.dtype(np.int8): 0x09, np.dtype(">i2"): 0x0B,
         np.dtype(">i4"): 0x0C, np.dtype(">f4"): 0x0D, np.dtype(">f8"): 0x0E}


def _idx_bytes(array, code):
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(">" + "I" * array.ndim, *array.shape)
    return header + array.tobytes()


def _write(path, array, compress=False):
    big_endian = array.astype(array.dtype.newbyteorder(">")) if array.itemsize > 1 else array
    payload = _idx_bytes(big_endian, CODES[big_endian.dtype])
    path.write_bytes(gzip.compress(payload) if compress else payload)
    return path


@pytest.mark.parametrize("dtype", [np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64])
@pytest.mark.parametrize("compress", [False, True])
def test_read_idx_round_trip(tmp_path, dtype, compress):
    array = (np.arange(2 * 3 * 4) - 5).astype(dtype).reshape(2, 3, 4)
    if dtype == np.uint8:
        array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    name = "a.idx.gz" if compress else "a.idx"
    result = read_idx(_write(tmp_path / name, array, compress))
    assert result.dtype == np.dtype(dtype) and result.dtype.isnative
    np.testing.assert_array_equal(result, array)


def test_read_idx_errors_name_the_problem(tmp_path):
    good = _idx_bytes(np.zeros((2, 2), dtype=np.uint8), 0x08)
    bad_magic = tmp_path / "magic"
    bad_magic.write_bytes(b"\x01" + good[1:])
    with pytest.raises(ValueError, match="magic number 0x01000802"):
        read_idx(bad_magic)
    bad_code = tmp_path / "code"
    bad_code.write_bytes(good[:2] + b"\x07" + good[3:])
    with pytest.raises(ValueError, match="type code 0x07"):
        read_idx(bad_code)
    truncated = tmp_path / "truncated"
    truncated.write_bytes(good[:-1])
    with pytest.raises(ValueError, match=r"\(2, 2\).*need 4 data bytes.*has 3"):
        read_idx(truncated)
    short_header = tmp_path / "header"
    short_header.write_bytes(good[:6])
    with pytest.raises(ValueError, match="2 dimensions"):
        read_idx(short_header)
    with pytest.raises(FileNotFoundError):
        read_idx(tmp_path / "missing")


def _mnist_files(folder, prefix, images, labels, compress):
    suffix = ".gz" if compress else ""
    _write(folder / f"{prefix}-images-idx3-ubyte{suffix}", images, compress)
    _write(folder / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress)


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_from_written_files(tmp_path, compress):
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(7, 4, 5), dtype=np.uint8)
    labels = rng.integers(0, 10, size=7).astype(np.uint8)
    _mnist_files(tmp_path, "t10k", images, labels, compress)
    ds = MNIST(tmp_path, train=False)
    assert len(ds) == 7
    x, y = ds[3]
    assert x.dtype == np.float32 and x.shape == (20,)
    np.testing.assert_allclose(x, images[3].reshape(-1) / 255.0, rtol=1e-6)
    assert y == labels[3] and ds.targets.dtype == np.int64
    np.testing.assert_array_equal(ds.data, images)
    assert MNIST(tmp_path, train=False, flatten=False)[0][0].shape == (1, 4, 5)
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        MNIST(tmp_path, train=True)


def test_mnist_rejects_mismatched_files(tmp_path):
    _mnist_files(tmp_path, "train", np.zeros((3, 2, 2), dtype=np.uint8),
                 np.zeros(4, dtype=np.uint8), False)
    with pytest.raises(ValueError, match="3 images.*4 labels"):
        MNIST(tmp_path)


def test_char_dataset_blocks_and_vocabulary(tmp_path):
    text = "abracadabra"
    ds = CharDataset(text, block_size=4)
    assert ds.chars == ["a", "b", "c", "d", "r"] and ds.vocab_size == 5
    assert len(ds) == len(text) - 4
    ids = ds.encode(text)
    assert ids.dtype == np.int64 and ds.decode(ids) == text
    for i in range(len(ds)):
        x, y = ds[i]
        assert ds.decode(x) == text[i:i + 4] and ds.decode(y) == text[i + 1:i + 5]
        assert x.dtype == np.int64
    path = tmp_path / "corpus.txt"
    path.write_text(text, encoding="utf-8")
    from_file = CharDataset(str(path), block_size=4)
    np.testing.assert_array_equal(from_file.data, ds.data)
    np.testing.assert_array_equal(CharDataset(path, block_size=4)[2][1], ds[2][1])
    with pytest.raises(ValueError, match="'z'"):
        ds.encode("z")
    with pytest.raises(ValueError, match="11 characters.*block_size 11"):
        CharDataset(text, block_size=11)
    with pytest.raises(IndexError):
        ds[len(ds)]
