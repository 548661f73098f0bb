"""``neural_arch.load`` on hostile and damaged input: a ``ValueError`` naming the file and what is
wrong, in bounded time and memory, never another exception, a hang, or an object built from
damage.

The crafted files here are written without the digest ``save`` adds, as a hostile writer
would: then nothing but the checks of every header field and structure node stands between the
file and the loaded object.
"""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import save as safetensors_bytes

import neural_arch as na

from repo_paths import REPO_ROOT

pytestmark = pytest.mark.timeout(60)
OURS = {"neural_arch.format": "1"}
# Loading a file of a few kilobytes takes milliseconds; this only catches a read without bound.
LOAD_S = 5.0


def _prefixed(header: bytes) -> bytes:
    """``header`` after the 8 bytes that give its length, as in every safetensors file."""
    return len(header).to_bytes(8, "little") + header


def _file(header, data: bytes = b"") -> bytes:
    """A safetensors file with ``header`` (an object, or JSON text taken as it is)."""
    text = header if isinstance(header, str) else json.dumps(header)
    return _prefixed(text.encode()) + data


def _crafted(structure: str, arrays=None) -> bytes:
    """A file whose structure JSON is ``structure``, as ``save`` would write it but unchecked."""
    return safetensors_bytes(arrays or {}, metadata=dict(OURS, **{"neural_arch.structure":
                                                                 structure}))


def _refused(tmp_path, content: bytes, reason: str):
    """Loads ``content`` from a path and from a file object: both raise ValueError naming the
    file and ``reason`` (a regular expression)."""
    path = tmp_path / "hostile.nf"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=rf"load: '{path}'.*{reason}"):
        na.load(path)
    stream = io.BytesIO(content)
    with pytest.raises(ValueError, match=rf"load: <_io.BytesIO object.*{reason}"):
        na.load(stream)


# ----- nesting ------------------------------------------------------------------------------
@pytest.mark.parametrize("structure", [
    "[" * 5000 + "]" * 5000,  # deeper than the JSON parser recurses
    "[" * 600 + "]" * 600,  # parsed, but deeper than decoding recursed
    '{"tuple":[' * 400 + "1" + "]}" * 400,
    '{"dict":[["k",' * 300 + "1" + "]],\"ordered\":false}" * 300,
], ids=["lists-5000", "lists-600", "tuples-400", "dicts-300"])
def test_a_deeply_nested_structure_is_refused_naming_the_limit(tmp_path, structure):
    _refused(tmp_path, _crafted(structure), "damaged.*nest.*deeper than")


def test_a_deeply_nested_header_is_refused(tmp_path):
    header = '{"__metadata__":{"neural_arch.format":"1"},"x":' + "[" * 100000 + "]" * 100000 + "}"
    _refused(tmp_path, _file(header), "not a file written by neural_arch.save.*nest")


# ----- the header -----------------------------------------------------------------------------
@pytest.mark.parametrize("metadata, reason", [
    (["neural_arch.format", "1"], "__metadata__ is a list"),
    ("1", "__metadata__ is a str"),
    (dict(OURS, **{"neural_arch.structure": 5}), "neural_arch.structure.*is a int|not a string"),
], ids=["list", "string", "structure-not-a-string"])
def test_metadata_of_the_wrong_type_is_refused(tmp_path, metadata, reason):
    _refused(tmp_path, _file({"__metadata__": metadata}), reason)


@pytest.mark.parametrize("entry, reason", [
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}, "8 bytes"),
    ({"dtype": "C64", "shape": [1], "data_offsets": [0, 8]}, "dtype 'C64'"),
    ({"dtype": "F32", "shape": [-1], "data_offsets": [0, 4]}, "shape"),
    ({"dtype": "F32", "shape": "2", "data_offsets": [0, 8]}, "shape"),
    ({"dtype": "F32", "shape": [2], "data_offsets": [0, 2 ** 70]}, "data_offsets|bytes"),
    ({"dtype": "F32", "shape": [2]}, "keys"),
    ("F32", "not an object"),
], ids=["size", "dtype", "negative", "shape-type", "huge", "missing", "not-an-object"])
def test_array_entries_are_checked(tmp_path, entry, reason):
    header = {"__metadata__": dict(OURS, **{"neural_arch.structure": "1"}), "0": entry}
    _refused(tmp_path, _file(header, bytes(8)), reason)


# ----- structure nodes --------------------------------------------------------------------------
ARRAYS = {"0": np.arange(6.0).reshape(2, 3), "1": np.arange(3)}


@pytest.mark.parametrize("structure, reason", [
    ('{"tuple": 5}', "obj is .*tuple"),
    ('{"array": [1], "device": "cpu"}', r"obj is .*array"),
    ('{"dict": 7, "ordered": false}', "obj is .*dict"),
    ('{"dict": [["a", 1], ["a", 2]], "ordered": false}', "key 'a' twice"),
    ('{"dict": [[1.5, 1]], "ordered": false}', r"\[key, value\]"),
    ('{"dict": [], "ordered": "yes"}', "obj is .*ordered"),
    ('{"tuple": [], "extra": 1}', "obj is .*extra"),
    ('{"float": "x"}', "obj is .*float"),
    ('{"array": "0", "device": "tpu"}', "obj is .*tpu"),
    ('{"scalar": "0"}', "scalar.*2 dimensions"),
    ('{"tensor": "1", "device": "cpu", "requires_grad": true, "parameter": false}',
     "int64 with requires_grad"),
    ('{"tensor": "0", "device": "cpu", "requires_grad": 1, "parameter": false}',
     "obj is .*requires_grad"),
    ('[{"array": "0", "device": "cpu"}, {"array": "0", "device": "cpu"}]',
     r"obj\[1\] names the array '0' a second time"),
    ('{"array": "0", "device": "cpu"}', r"never names.*'1'"),
    ('{"array": "7", "device": "cpu"}', "names no array"),
    ("NaN", "not readable JSON"),
], ids=["tuple-int", "array-list", "dict-int", "dict-duplicate", "dict-float-key",
        "ordered-string", "extra-key", "float-unknown", "device-unknown", "scalar-not-0d",
        "int-requires-grad", "requires-grad-int", "array-twice", "array-unused", "array-missing",
        "json-nan"])
def test_malformed_structure_nodes_are_refused_naming_where(tmp_path, structure, reason):
    _refused(tmp_path, _crafted(structure, ARRAYS), f"damaged.*{reason}")


# ----- what is not a regular file ---------------------------------------------------------------
def test_devices_fifos_and_directories_are_refused_without_reading(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no writer: opening it for reading would wait for one
    links = {"null": "/dev/null", "zero": "/dev/zero"}
    for link, target in links.items():
        os.symlink(target, tmp_path / link)
    cases = {"/dev/zero": "a character device", str(fifo): "a FIFO",
             str(tmp_path): "a directory",
             str(tmp_path / "null"): "a character device.*a link to '/dev/null'",
             str(tmp_path / "zero"): "a character device.*a link to '/dev/zero'"}
    for path, kind in cases.items():
        started = time.monotonic()
        with pytest.raises(ValueError, match=rf"load: '{path}' is not a regular file: it is "
                                             rf"{kind}"):
            na.load(path)
        assert time.monotonic() - started < LOAD_S, path


def test_a_missing_file_is_still_file_not_found(tmp_path):
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling")
    for path in (tmp_path / "missing.nf", tmp_path / "dangling"):
        with pytest.raises(FileNotFoundError, match="no file at"):
            na.load(path)


# A child with little address space: a read without bound ends there (MemoryError), never on
# the test machine.
DEV_ZERO_CHILD = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (1536 * 2 ** 20, 1536 * 2 ** 20))
import neural_arch as na
try:
    with open("/dev/zero", "rb") as f:
        na.load(f)
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def test_dev_zero_as_a_file_object_is_refused_after_reading_its_header():
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), OPENBLAS_NUM_THREADS="1",
               OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(DEV_ZERO_CHILD)], env=env,
                          capture_output=True, text=True, timeout=45)
    assert done.stdout.startswith("ValueError load: '/dev/zero' is not a file written by "
                                  "neural_arch.save"), (done.stdout, done.stderr)


class EndlessStream(io.RawIOBase):
    """``content``, then zeros without end; counts what was read."""

    def __init__(self, content: bytes) -> None:
        self.content, self.position = content, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self.position > len(self.content) + 2 ** 26:
            raise AssertionError("read 64 MiB past the end of the file")
        chunk = self.content[self.position:self.position + len(buffer)]
        chunk += bytes(len(buffer) - len(chunk))
        buffer[:len(chunk)] = chunk
        self.position += len(chunk)
        return len(chunk)


def test_a_stream_is_read_only_as_far_as_its_header_declares():
    saved = io.BytesIO()
    na.save({"w": np.arange(1000.0), "n": 3}, saved)
    stream = EndlessStream(saved.getvalue())
    out = na.load(io.BufferedReader(stream, buffer_size=1))
    assert out["n"] == 3 and out["w"].tolist() == list(range(1000))
    assert stream.position == len(saved.getvalue())


def test_a_stream_that_ends_early_is_refused_without_allocating_what_it_declares():
    header = {"__metadata__": dict(OURS, **{"neural_arch.structure": "1"}),
              "0": {"dtype": "U8", "shape": [2 ** 40], "data_offsets": [0, 2 ** 40]}}
    with pytest.raises(ValueError, match=r"damaged: it ends after 10 bytes of arrays, where its "
                                         r"header declares 1099511627776"):
        na.load(io.BytesIO(_file(header, bytes(10))))


# ----- fuzzing ----------------------------------------------------------------------------------
def _valid_file() -> bytes:
    out = io.BytesIO()
    na.save({"w": np.arange(12, dtype=np.float32).reshape(3, 4), "t": (1, "a", None),
             "opt": {"lr": 0.1, 3: [np.int64(2), na.tensor([1.0])]}}, out)
    return out.getvalue()


VALID = _valid_file()


def _load_refused(content: bytes) -> None:
    started = time.monotonic()
    with pytest.raises(ValueError, match=r"load: <_io.BytesIO object"):
        na.load(io.BytesIO(content))
    assert time.monotonic() - started < LOAD_S


FUZZ = settings(max_examples=150, deadline=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(st.binary(max_size=600) | st.binary(max_size=400).map(_prefixed))
def test_random_bytes_are_refused(content):
    _load_refused(content)


@FUZZ
@given(st.integers(0, len(VALID) - 1))
def test_every_truncation_is_refused(length):
    _load_refused(VALID[:length])


@FUZZ
@given(st.integers(0, len(VALID) - 1), st.integers(1, 255))
def test_every_changed_byte_is_refused(index, change):
    damaged = bytearray(VALID)
    damaged[index] ^= change
    _load_refused(bytes(damaged))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False,
                                                                          allow_infinity=False)
                    | st.sampled_from(["0", "1", "cpu", "cuda", "nan", "tuple", "dict"]),
                    lambda inner: st.lists(inner, max_size=3)
                    | st.dictionaries(st.sampled_from(["tuple", "dict", "ordered", "float",
                                                       "array", "scalar", "tensor", "device",
                                                       "requires_grad", "parameter"]), inner,
                                      max_size=4), max_leaves=12)


@FUZZ
@given(JSON)
def test_any_structure_loads_or_is_refused_with_value_error(structure):
    started = time.monotonic()
    try:
        na.load(io.BytesIO(_crafted(json.dumps(structure), ARRAYS)), map_location="cpu")
    except ValueError as exc:
        assert "is damaged" in str(exc)
    assert time.monotonic() - started < LOAD_S
